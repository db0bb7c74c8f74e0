"""A hostile harness against the local sandbox, through `harnessrl runner` as a process, run as root and as an
unprivileged user: every escape it tries (tests/fixtures/hostile_harness.py) fails, it still reaches its proxy,
its planted reward is not graded, and a harness that hangs ends as a timeout with nothing left running."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harnessrl.runtime.harness.sandboxes.local import tagged_pids

from tests.fakes.scripted_engine import ScriptedReply
from tests.fixtures.runner_token import runner_token_file
from tests.fixtures.unprivileged import as_user

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"
HOSTILE = Path(__file__).resolve().parents[1] / "fixtures" / "programs" / "hostile_harness.py"
NOBODY = 65534
FORK_LIMIT = 64
FILE_MB = 8
SECRET = "runner-secret-7f3a"

if os.geteuid() != 0:
    pytest.skip("runs the runner both as root and as an unprivileged user: needs root", allow_module_level=True)
if shutil.which("bwrap") is None:
    if os.environ.get("CI"):
        pytest.fail("bubblewrap is missing in CI: `make test` installs it (apt-get install bubblewrap)")
    pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)", allow_module_level=True)


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A directory both root and the unprivileged user can use (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="hostile-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def listener() -> Iterator[int]:
    """Another service on loopback that no sandbox may reach."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


WRITE_CHECKED = [str(Path.cwd()), "/usr", "/etc"]


def host_escape(directory: Path) -> bool:
    """Whether the hostile harness's write reached this host directory."""
    target = directory / "answer.txt"
    return target.exists() and target.read_text() == "escaped\n"


def wait_for_line(path: Path, needle: str, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if needle in text:
            return text
        if proc.poll() is not None:
            raise AssertionError(f"runner exited {proc.returncode}:\n{text}")
        time.sleep(0.2)
    raise AssertionError(f"no {needle!r} in the runner's log:\n{path.read_text()}")


def run_hostile(stack: Any, workdir: Path, listener: int, user: str, hang: bool) -> tuple[str, dict[str, Any], Path]:
    """Run one runner process until it has completed a rollout; its log, the harness's report, the sandbox base."""
    owner = NOBODY if user == "nobody" else 0
    tasks = workdir / "tasks"
    shutil.copytree(TASKS / "train" / "sales-total", tasks / "sales-total")
    runner_token = runner_token_file(workdir)
    runner_token.chmod(0o600)
    # Another rollout's workspace with its answer in it, next to this runner's sandboxes.
    base = workdir / "sandboxes"
    other = base / "other-pool-runner-9-x" / "workspace"
    other.mkdir(parents=True)
    (other / "answer.txt").write_text("another rollout's answer")
    coordinator = stack.coordinator_url.split("//")[1].split(":")
    targets = {
        "expected": str(tasks / "sales-total" / "tests" / "expected.json"),
        "other_workspace_file": str(other / "answer.txt"),
        "token_files": [str(runner_token), str(stack.proxy.config_path.parent / "admin-token")],
        "runner_secret": SECRET,
        "runner_pid": 0,  # filled below: the runner's own pid is known once it runs; its parent's is ours
        "write_dirs": [str(Path.cwd()), str(workdir), str(tasks)],
        "coordinator_host": coordinator[0], "coordinator_port": coordinator[1].rstrip("/"),
        "other_port": listener, "fork_limit": FORK_LIMIT, "fill_mb": 2 * FILE_MB,
    }
    targets["runner_pid"] = os.getpid()  # the test process holds the coordinator and the secret too
    config = {
        "pool": "custom-pool", "runner_id": f"runner-{user}",
        "harness": {"kind": "custom", "name": "my-agent", "dialect": "openai_chat",
                    "command": f"{sys.executable} {HOSTILE} {{base_url}} {{api_key}} {{model}} {{instruction}}",
                    "env": {"HOSTILE_TARGETS": json.dumps(targets), "HOSTILE_HANG": "1" if hang else "0"}},
        "sandbox": {"kind": "local", "base_dir": str(base), "keep": True, "read_only_paths": [str(HOSTILE)],
                    "max_processes": FORK_LIMIT, "max_file_mb": FILE_MB, "cpu_seconds": 60, "memory_mb": 2048},
        "tasks": {"kind": "dir", "path": str(tasks)},
        "concurrency": 1, "infra_retries": 0,
        "coordinator_url": stack.coordinator_url,
        "runner_token_file": str(runner_token),
        "timeouts": {"harness_s": 20 if hang else 120},
    }
    config_path = workdir / "runner.yaml"
    config_path.write_text(yaml.safe_dump(config))
    for path in [workdir, *workdir.rglob("*")]:
        os.chown(path, owner, owner)
    log_path = workdir / "runner.log"
    argv = [str(Path(sys.executable).parent / "harnessrl"), "runner", "--config", str(config_path)]
    if user == "nobody":
        stage = Path(tempfile.mkdtemp(prefix="stage-", dir="/tmp"))
        argv = as_user(NOBODY, argv, stage)
    env = {**os.environ, "HARNESSRL_TEST_SECRET": SECRET}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=workdir)
    try:
        log_text = wait_for_line(log_path, "correctness=", proc, 180)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # Whatever the harness planted (FIFOs and /dev/zero where the runner once kept its files), the runner stopped
    # on SIGTERM by itself.
    assert proc.returncode != -signal.SIGKILL, log_path.read_text()
    reports = list(base.glob("custom-pool-*/workspace/escapes.json"))
    assert len(reports) >= 1, log_text
    return log_text, json.loads(reports[0].read_text()), base


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_every_escape_fails_and_the_rollout_is_graded_as_wrong(
    rollout_stack: Any, workdir: Path, listener: int, user: str
) -> None:
    stack = rollout_stack([("custom-pool", "my-agent")], "sales-total", group_size=2)
    stack.engine.set_script([ScriptedReply(content="hello from the proxy")])
    log, report, base = run_hostile(stack, workdir, listener, user, hang=False)
    assert report.pop("proxy") == {"escaped": False, "reached": True, "detail": "hello from the proxy"}
    # Writes land, if anywhere, in the sandbox's own throwaway /tmp: judged by what the host's directories hold.
    written = report.pop("write outside the workspace")
    assert not [d for d in [*WRITE_CHECKED, str(workdir), str(base)] if host_escape(Path(d))], written
    escaped = {name: r["detail"] for name, r in report.items() if r["escaped"]}
    assert escaped == {}, escaped
    assert len(report) == 11
    # The planted reward.txt was not graded, nor did the FIFO answer wedge the grader: the task was not solved.
    assert ": wrong correctness=0.00" in log, log
    assert not host_escape(workdir / "tasks")
    assert (base / "other-pool-runner-9-x" / "workspace" / "answer.txt").read_text() == "another rollout's answer"
    assert tagged_pids(f"custom-pool-runner-{user}-") == []  # the daemon it left is gone


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_a_harness_that_outlives_its_timeout_ends_as_a_timeout(
    rollout_stack: Any, workdir: Path, listener: int, user: str
) -> None:
    stack = rollout_stack([("custom-pool", "my-agent")], "sales-total", group_size=2)
    stack.engine.set_script([ScriptedReply(content="hello")])
    log, report, _ = run_hostile(stack, workdir, listener, user, hang=True)
    assert ": timeout correctness=0.00" in log and "harness ran past 20s" in log, log
    report.pop("write outside the workspace")
    assert not any(r["escaped"] for r in report.values()), report
    assert not [d for d in [*WRITE_CHECKED, str(workdir)] if host_escape(Path(d))]
    assert tagged_pids(f"custom-pool-runner-{user}-") == []
