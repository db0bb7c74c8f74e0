"""The local supervisor: health waits, restarts within a budget, and process-group teardown (real processes)."""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path

import pytest
from harnessrl.runtime.ports import free_ports

from harnessrl.local.supervisor import START_MARKER, ProcessSpec, Supervisor, SupervisorError, last_error

# A tiny HTTP server that answers /health with 200, then optionally dies after a delay.
SERVER = """
import http.server, os, sys, threading, time
port, die_after = int(sys.argv[1]), float(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
srv = http.server.HTTPServer(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
if die_after > 0:
    time.sleep(die_after); os._exit(3)
time.sleep(600)
"""


def spec(tmp_path: Path, name: str, die_after: float = 0.0, **kw: object) -> ProcessSpec:
    port = free_ports()
    return ProcessSpec(
        name=name,
        argv=[sys.executable, "-c", SERVER, str(port), str(die_after)],
        env={},
        log=tmp_path / f"{name}.log",
        health_url=f"http://127.0.0.1:{port}/health",
        start_timeout_s=20.0,
        **kw,  # type: ignore[arg-type]
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] != "Z"


def test_waits_for_health_and_stops_the_whole_group(tmp_path: Path) -> None:
    supervisor = Supervisor()
    # The component starts a grandchild; stopping the component must stop it too.
    child_pid_file = tmp_path / "child.pid"
    parent = ProcessSpec(
        name="parent",
        argv=[sys.executable, "-c",
              "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
              f"open({str(child_pid_file)!r}, 'w').write(str(p.pid)); time.sleep(600)"],
        env={},
        log=tmp_path / "parent.log",
    )
    try:
        server = supervisor.start(spec(tmp_path, "server"))
        supervisor.start(parent)
        deadline = time.monotonic() + 10
        while not child_pid_file.exists() or not child_pid_file.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        grandchild = int(child_pid_file.read_text())
        assert server.popen is not None and server.popen.poll() is None
        assert supervisor.check() is False
    finally:
        supervisor.stop_all(grace_s=5)
    # The whole group was signalled (SIGTERM, then SIGKILL); the orphaned grandchild is not the supervisor's to
    # reap, and the kernel takes a moment to tear it down.
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(grandchild)
    assert all(m.popen is not None and m.popen.poll() is not None for m in supervisor.procs)


def test_crashed_component_is_restarted_then_budget_exhausted(tmp_path: Path) -> None:
    supervisor = Supervisor(restart_budget=1, poll_s=0.05)
    try:
        managed = supervisor.start(spec(tmp_path, "flaky", die_after=0.5))
        first_pid = managed.popen.pid if managed.popen else None
        deadline = time.monotonic() + 20
        while managed.restarts == 0:
            assert time.monotonic() < deadline
            supervisor.check()
            time.sleep(0.1)
        assert managed.popen is not None and managed.popen.pid != first_pid
        assert managed.exit_codes == [3]
        with pytest.raises(SupervisorError, match="used its 1 restarts"):
            while time.monotonic() < deadline:
                supervisor.check()
                time.sleep(0.1)
    finally:
        supervisor.stop_all(grace_s=5)
    assert "starting flaky" in (tmp_path / "flaky.log").read_text()


def test_clean_exit_of_the_finishing_component_ends_the_run(tmp_path: Path) -> None:
    supervisor = Supervisor(restart_budget=0)
    done = ProcessSpec(name="learner", argv=[sys.executable, "-c", "pass"], env={}, log=tmp_path / "l.log",
                       finishes_run=True)
    try:
        supervisor.start(done)
        deadline = time.monotonic() + 10
        while not supervisor.check():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        supervisor.stop_all(grace_s=2)


def test_component_that_dies_while_starting_is_reported_with_its_log(tmp_path: Path) -> None:
    supervisor = Supervisor()
    broken = ProcessSpec(name="broken", argv=[sys.executable, "-c", "import sys; sys.exit(7)"], env={},
                         log=tmp_path / "broken.log", health_url="http://127.0.0.1:9/health", start_timeout_s=10)
    with pytest.raises(SupervisorError, match=r"broken exited with status 7 while starting; see .*broken.log"):
        supervisor.start(broken)
    supervisor.stop_all(grace_s=1)


def test_clean_exit_of_a_done_component_is_not_restarted(tmp_path: Path) -> None:
    supervisor = Supervisor(restart_budget=3)
    runner = ProcessSpec(name="runner", argv=[sys.executable, "-c", "pass"], env={}, log=tmp_path / "r.log",
                         done_on_clean_exit=True)
    try:
        managed = supervisor.start(runner)
        deadline = time.monotonic() + 10
        while managed.popen is not None:
            assert time.monotonic() < deadline
            assert supervisor.check() is False
            time.sleep(0.05)
        assert managed.restarts == 0 and managed.exit_codes == [0]
        assert supervisor.check() is False
    finally:
        supervisor.stop_all(grace_s=2)


def test_replace_restarts_a_component_on_a_new_spec_outside_the_budget(tmp_path: Path) -> None:
    """What `harnessrl run` does with weightSync restart: the engine is stopped and started on new weights."""
    import json

    supervisor = Supervisor(restart_budget=0, pid_file=tmp_path / "pids.json")
    try:
        managed = supervisor.start(spec(tmp_path, "engine-0"))
        old = managed.popen
        assert old is not None
        new_spec = spec(tmp_path, "engine-0")
        supervisor.replace("engine-0", new_spec, grace_s=5)
        assert old.poll() is not None and not alive(old.pid)
        assert managed.spec is new_spec and managed.popen is not None and managed.popen.poll() is None
        assert json.loads((tmp_path / "pids.json").read_text()) == {"engine-0": managed.popen.pid}
        # Planned, so neither a crash nor a restart: the budget of 0 still holds for real crashes.
        assert supervisor.check() is False and managed.restarts == 0 and managed.exit_codes == []
    finally:
        supervisor.stop_all(grace_s=5)


def test_a_component_that_exits_failed_is_not_restarted(tmp_path: Path) -> None:
    from harnessrl.runtime.contracts.learner_exit import EXIT_FAILED

    log = tmp_path / "learner.log"
    sup = Supervisor(restart_budget=3, poll_s=0.05)
    m = sup.start(ProcessSpec(name="learner", env={}, log=log, argv=[
        sys.executable, "-c", f"print('WeightSyncRejected: the engine said no'); raise SystemExit({EXIT_FAILED})"]))
    assert m.popen is not None
    m.popen.wait(timeout=30)
    with pytest.raises(SupervisorError, match="not restarted: WeightSyncRejected: the engine said no"):
        sup.check()
    assert m.restarts == 0


def test_stopping_says_what_it_stops_waits_for_and_kills(tmp_path: Path) -> None:
    """Ctrl-C used to stop a run in 15-20 s of silence: every step of the stop is now said as it happens."""
    supervisor = Supervisor()
    quick = ProcessSpec(name="quick", argv=[sys.executable, "-c", "import time; time.sleep(600)"], env={},
                        log=tmp_path / "quick.log")
    ready = tmp_path / "stubborn.ready"
    # Ignores SIGTERM, as a component busy in a long call may: only SIGKILL ends it.
    stubborn = ProcessSpec(
        name="stubborn", env={}, log=tmp_path / "stubborn.log",
        argv=[sys.executable, "-c", "import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              f"pathlib.Path({str(ready)!r}).touch(); time.sleep(600)"],
    )
    said: list[tuple[float, str]] = []
    supervisor.start(quick)
    supervisor.start(stubborn)
    deadline = time.monotonic() + 10
    while not ready.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    began = time.monotonic()
    supervisor.stop_all(grace_s=4, say=lambda line: said.append((time.monotonic() - began, line)))
    lines = [line for _, line in said]
    assert lines[0] == "stopping stubborn, quick (each gets 4 s, then is killed)"
    assert lines[1].startswith("quick stopped (exit status -15) after 0.")  # said as it ends, not after the rest
    assert lines[2] == "still waiting for stubborn (3 s of 4 s)"
    assert lines[3:] == ["stubborn did not stop in 4 s: killed"]
    # No silence longer than the progress interval while it waits.
    times = [0.0] + [t for t, _ in said]
    assert max(b - a for a, b in itertools.pairwise(times)) < 3.5
    assert all(m.popen is not None and m.popen.poll() is not None for m in supervisor.procs)


def test_the_last_error_since_the_last_start_is_named() -> None:
    """vLLM exits 0 when its worker dies; the reason is a logger-prefixed exception line in its log."""
    log = (
        f"\n{START_MARKER}engine-0: python -m vllm\n"
        "(Worker pid=1) ERROR [executor.py:1] ValueError: from the first start\n"
        f"\n{START_MARKER}engine-0: python -m vllm\n"
        "(Worker pid=2) ERROR [executor.py:1] Traceback (most recent call last):\n"
        "(Worker pid=2) ERROR [executor.py:1]     raise exc.CppCompileError(cmd, output) from e\n"
        "(Worker pid=2) ERROR [executor.py:1] torch._inductor.exc.InductorError: CppCompileError: C++ compile error\n"
        "(APIServer pid=3) INFO shutting down\n"
    )
    assert last_error(log) == "torch._inductor.exc.InductorError: CppCompileError: C++ compile error"
    assert last_error(f"{START_MARKER}x\nINFO all good\n") is None
    assert last_error(log.rsplit(START_MARKER, 1)[0]) == "ValueError: from the first start"


def test_a_restart_says_the_error_that_ended_the_component(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = "import sys; print('RuntimeError: engine core died', file=sys.stderr, flush=True); sys.exit(0)"
    crash = ProcessSpec(name="engine-0", argv=[sys.executable, "-c", code], env=dict(os.environ),
                        log=tmp_path / "engine-0.log")
    supervisor = Supervisor(restart_budget=1, poll_s=0.05)
    try:
        managed = supervisor.start(crash)
        deadline = time.monotonic() + 20
        while managed.restarts == 0:
            assert time.monotonic() < deadline
            supervisor.check()
            time.sleep(0.05)
    finally:
        supervisor.stop_all(grace_s=5)
    out = capsys.readouterr().out
    assert "engine-0 exited with status 0; restarting (1/1); its last error: RuntimeError: engine core died" in out
