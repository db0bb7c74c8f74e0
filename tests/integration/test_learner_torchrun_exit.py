"""A fatal learner failure under torchrun ends the Pod with status 78, as the Job's podFailurePolicy expects.

The learner exits 78 (EXIT_FAILED) when no restart can help; torchrun's agent turned that into 1, so for
`learner.gpus > 1` (and JobSets) the fail-at-once rule never fired and the restart budget was spent. Here the
learner runs under the command the operator renders for 2 GPUs (`harnessrl torchrun ... --no-python harnessrl
learner`), 2 processes on gloo, with a config rank 0 refuses at start (NCCL sync from a sharded learner), and
beside it plain torchrun on the same config, which still exits 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harnessrl.operator.kube.learner import CONFIG_DIR, TORCHRUN
from harnessrl.runtime.contracts.learner_exit import (
    EXIT_FAILED,
    WEIGHT_SYNC_UNSUPPORTED,
    parse_termination_message,
)

from tests.fixtures.runner_token import runner_token_file
from tests.ports import free_port
from tests.unit.test_operator_manifests import manifests

pytestmark = pytest.mark.slow


def rendered_command(config: Path) -> list[str]:
    """The learner container's command for 2 GPUs, pointed at `config` and this venv's programs."""
    [container] = manifests(learner={"gpus": 2})[("Job", "run-learner")]["spec"]["template"]["spec"]["containers"]
    bin_dir = Path(sys.executable).parent
    command = [str(config) if arg == f"{CONFIG_DIR}/config.yaml" else arg for arg in container["command"]]
    assert command[:2] == TORCHRUN and "--no-python" in command
    return [str(bin_dir / command[0]), *command[1:command.index("--no-python") + 1], str(bin_dir / "harnessrl"),
            *command[command.index("--no-python") + 2:]]


def run(command: list[str], workdir: Path, log: Path) -> int:
    env = os.environ | {"OMP_NUM_THREADS": "1", "HARNESSRL_TERMINATION_LOG": str(workdir / "termination-log")}
    with log.open("wb") as out:
        return subprocess.run(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=300).returncode


def test_rank_zeros_fatal_exit_78_ends_the_torchrun_pod_with_78(tmp_path: Path, tiny_model_dir: Path) -> None:
    token = tmp_path / "admin-token"
    token.write_text("admin")
    config = tmp_path / "learner.yaml"
    config.write_text(yaml.safe_dump({
        "run_name": "fatal",
        "model": {"path": str(tiny_model_dir), "served_name": "tiny", "device": "cpu"},
        "adapter": {"kind": "full"},
        "grpo": {"group_size": 2, "groups_per_step": 1, "steps": 1},
        "harnesses": [{"pool": "p", "harness": "h", "weight": 1}],
        "tasks": {"ids": ["t"]},
        "proxy": {"url": "http://127.0.0.1:9", "admin_token_file": str(token)},
        # Full weights over NCCL from a learner of 2 processes: refused by rank 0 at start, no restart can help.
        "engine": {"urls": ["http://127.0.0.1:9"], "sync": "nccl"},
        "checkpoint": {"dir": str(tmp_path / "ckpt")},
        "host": "127.0.0.1",
        "port": free_port(),
        "runner_token_file": str(runner_token_file(tmp_path)),
    }))
    command = rendered_command(config)
    status = run(command, tmp_path, tmp_path / "launch.log")
    log = (tmp_path / "launch.log").read_text(errors="replace")
    assert status == EXIT_FAILED, log[-4000:]
    assert "exitcode  : 78" in log  # torchrun's own report of the worker, still printed
    reason, message = parse_termination_message((tmp_path / "termination-log").read_text()) or ("", "")
    assert reason == WEIGHT_SYNC_UNSUPPORTED and "one process" in message
    # Plain torchrun, the same arguments: the 78 is lost.
    plain = [sys.executable, "-m", "torch.distributed.run", *command[2:]]
    assert run(plain, tmp_path, tmp_path / "plain.log") == 1
    assert "exitcode  : 78" in (tmp_path / "plain.log").read_text(errors="replace")
