"""The programs harnessrl starts (the proxy's workers, `harnessrl run`'s components, `harnessrl eval`'s
coordinator) start whatever the working directory: a folder there named like a module they import (the
checkout's `operator/` is the standard library's name) is never imported in its place. Before, they ran
`python -P -m ...`, and without -P the working directory came first on sys.path (runtime/programs.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from harnessrl.runtime.programs import python_module
from harnessrl.runtime.proxy.workers import worker_command

from harnessrl.local import gpus
from harnessrl.local.run import plan_run, process_specs
from tests.unit.test_local_plan import args

ROOT = Path(__file__).resolve().parents[2]
# Each program, asked for its usage: it imports its module (and pydantic) and exits 0.
PROGRAMS = [
    ("harnessrl.cli", "proxy", "--help"),
    ("harnessrl.cli", "runner", "--help"),
    ("harnessrl.runtime.proxy.main", "--help", "--worker", "0"),
    ("harnessrl.runtime.evaluation.coordinator", "--help"),
]


@pytest.fixture(scope="module")
def decoys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory whose `operator` and `pydantic` folders fail on import."""
    cwd = tmp_path_factory.mktemp("cwd")
    for name in ("operator", "pydantic"):
        (cwd / name).mkdir()
        (cwd / name / "__init__.py").write_text("raise ImportError('imported from the working directory')\n")
    return cwd


def start(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: " ".join(p[:2]))
def test_a_program_starts_from_the_repo_root_and_from_any_directory(program: tuple[str, ...], decoys: Path) -> None:
    for cwd in (ROOT, decoys):
        done = start(python_module(*program), cwd)
        assert done.returncode == 0 and "usage" in done.stdout.lower(), (cwd, done.stderr[-2000:])


def test_the_decoys_shadow_a_plain_python_m(decoys: Path) -> None:
    """What the programs escape: `python -m` imports the working directory's folder instead."""
    done = start([sys.executable, "-m", "harnessrl.cli", "proxy", "--help"], decoys)
    assert done.returncode != 0 and "imported from the working directory" in done.stderr


def test_every_started_program_goes_through_the_bootstrap(tmp_path: Path) -> None:
    """The proxy's workers, the local run's proxy, runner and learner (alone or under torchrun): no -P."""
    commands = [worker_command(["--config", "proxy.yaml"], 1, 7), gpus.learner_argv(1, Path("l.yaml")),
                gpus.learner_argv(2, Path("l.yaml"))]
    (tmp_path / "model").mkdir()  # planning reads no weights
    plan, _ = plan_run(args(tmp_path, tmp_path / "model"))
    commands += [spec.argv for spec in process_specs(plan, tmp_path / "run") if not spec.name.startswith("engine")]
    assert len(commands) == 6
    for argv in commands:
        assert argv[:3] == python_module("")[:3] and "-P" not in argv, argv
    assert commands[0][3:] == ["harnessrl.runtime.proxy.main", "--config", "proxy.yaml", "--worker", "1",
                               "--heartbeat-fd", "7"]
