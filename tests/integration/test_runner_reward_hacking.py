"""The reward-hacking suite: a harness that tries every known way to be graded solved without solving
(tests/fixtures/reward_hacking.py: early exit, a hostile solution, planted rewards, a patched interpreter and
shadowed modules and commands, symlinked, FIFO and /dev/zero answers, edited tests, a process left behind) on every
shipped task family, in the local sandbox with a root runner and an unprivileged one. Every attack scores 0; the
reference answer, through the same path, scores 1 (so the grading itself works there)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.reward_hacking import ATTACKS, probe
from tests.fixtures.unprivileged import as_user

ROOT = Path(__file__).resolve().parents[2]
# One task of each shipped family: a function (code), a number, JSON and lines from data (examples/tasks), and the
# quickstart's (and the transfer experiment's) vowel task.
TASKS = [ROOT / "examples" / "tasks" / "test" / "gcd", ROOT / "examples" / "tasks" / "train" / "sales-total",
         ROOT / "examples" / "tasks" / "test" / "region-totals", ROOT / "examples" / "tasks" / "train" / "dedupe-lines",
         ROOT / "examples" / "quickstart" / "tasks" / "train" / "vowel-00"]
NOBODY = 65534

if os.geteuid() != 0:
    pytest.skip("runs the sandbox both as root and as an unprivileged user: needs root", allow_module_level=True)
if shutil.which("bwrap") is None:
    if os.environ.get("CI"):
        pytest.fail("bubblewrap is missing in CI: `make test` installs it (apt-get install bubblewrap)")
    pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)", allow_module_level=True)


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A directory both root and the unprivileged user can use (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="hacks-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def check(found: dict[str, dict[str, str]]) -> None:
    assert sorted(found) == sorted(p.name for p in TASKS)
    for task, outcomes in found.items():
        assert outcomes.pop("reference") == "solved", (task, outcomes)
        assert sorted(outcomes) == sorted(ATTACKS)
        graded_solved = {attack: got for attack, got in outcomes.items() if got == "solved"}
        assert graded_solved == {}, task


async def test_no_attack_is_graded_solved_with_a_root_runner(workdir: Path) -> None:
    from harnessrl.runtime.harness.tasks import load_task

    check(await probe(workdir / "base", [load_task(p) for p in TASKS], {"reference": "", **ATTACKS}))


def test_no_attack_is_graded_solved_with_an_unprivileged_runner(workdir: Path) -> None:
    (workdir / "base").mkdir()
    os.chown(workdir / "base", NOBODY, NOBODY)
    # The tasks where the unprivileged runner can read them (a checkout may be root's alone, as CI's clone is).
    tasks = [workdir / "tasks" / path.name for path in TASKS]
    for path, copy in zip(TASKS, tasks, strict=True):
        shutil.copytree(path, copy)
    # Run as a script: a directory the unprivileged user may only traverse cannot be listed, so `tests` would not
    # import from it (the fixture needs only harnessrl, which the editable install maps by path).
    script = ROOT / "tests" / "fixtures" / "reward_hacking.py"
    argv = as_user(NOBODY, [sys.executable, "-P", str(script), str(workdir / "base"), *map(str, tasks)],
                   Path(tempfile.mkdtemp(prefix="stage-", dir="/tmp")))
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=workdir, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    check(json.loads(res.stdout.strip().splitlines()[-1]))
