"""Every shipped task, run as Harbor runs a task: its reference solution passes its verifier, and an untouched
workspace fails it (real bash and python processes, so this lives with the integration tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harnessrl.runtime.harness.tasks import Task, load_dir

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def test_every_task_is_solvable_and_its_grader_discriminates(tmp_path: Path) -> None:
    """For each shipped task: its reference solution (solution/solve.sh) earns reward 1 from tests/test.sh, an
    untouched workspace earns 0 — run as Harbor would, with WORKSPACE/TESTS_DIR/LOGS_DIR set."""
    env_path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # python3 = this interpreter

    def trial(task: Task, solve: bool) -> str | None:
        ws, logs = tmp_path / task.id / str(solve) / "ws", tmp_path / task.id / str(solve) / "logs"
        shutil.copytree(task.environment_dir, ws)
        env = {"PATH": env_path, "WORKSPACE": str(ws), "TESTS_DIR": str(task.tests_dir), "LOGS_DIR": str(logs)}
        if solve:
            subprocess.run(["bash", str(task.path / "solution" / "solve.sh")], env=env, check=True, timeout=60)
        out = subprocess.run(["bash", str(task.tests_dir / "test.sh")], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
        reward = (logs / "verifier" / "reward.txt").read_text().strip() if out.returncode == 0 else "error"
        return None if reward == ("1" if solve else "0") else f"{task.id} solved={solve}: {reward}: {out.stdout}"

    tasks = list(load_dir(TASKS).values())
    # Threads only overlap the subprocesses' start-up; each trial has its own directories.
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(trial, tasks + tasks, [True] * len(tasks) + [False] * len(tasks)))
    assert [r for r in results if r] == []
