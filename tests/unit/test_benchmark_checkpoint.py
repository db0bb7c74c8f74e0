"""benchmarks/checkpoint/bench.py on CPU with the tiny shape: each mode's steps ran, every ratio is computed from
them, and the background mode's last checkpoint was written whole."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

# Loaded under its own name: benchmarks/learner's script is a `bench` module too.
_spec = importlib.util.spec_from_file_location(
    "checkpoint_bench", Path(__file__).resolve().parents[2] / "benchmarks" / "checkpoint" / "bench.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

pytestmark = pytest.mark.slow


def test_tiny_run_reports_each_mode_against_the_others(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    argv = ["--tiny", "--steps", "2", "--rounds", "1", "--sequences", "2", "--seq-len", "32", "--out", str(out)]
    assert bench.main(argv) == 0
    r = json.loads(out.read_text())
    assert {m: len(s) for m, s in r["step_s_each"].items()} == dict.fromkeys(bench.MODES, 2)
    assert r["step_s"] == {m: pytest.approx(sum(s) / 2) for m, s in r["step_s_each"].items()}
    assert r["vs_no_checkpoint"] == {m: pytest.approx(r["step_s"][m] / r["step_s"]["none"])
                                     for m in ("inline", "background")}
    assert r["inline_over_background"] == pytest.approx(r["step_s"]["inline"] / r["step_s"]["background"])
    # A full fine-tune's checkpoint: fp32 weights and AdamW's two fp32 moments, 12 bytes per parameter.
    assert r["checkpoint_bytes"] > 12 * r["parameters"] > 0
    # One warm-up step, then 2 per mode: the background mode's last write finished and `latest` names it.
    assert r["last_checkpoint"] == f"step-{1 + 2 * len(bench.MODES):07d}"
    assert r["snapshot_s"] > 0 and r["write_s"] > 0 and r["tokens_per_step"] == 64
    assert "inline/background" in capsys.readouterr().out
