"""Local processes of a run: start in order, wait until healthy, restart on crash, stop in reverse order.

Each component runs in its own session (process group), so stopping it also stops what it started (a
runner's harness CLIs, vLLM's engine core). A crashed component is restarted within its budget; the
components themselves resume from their durable state (the proxy's journal, the learner's checkpoints).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from harnessrl.runtime.contracts.learner_exit import EXIT_FAILED

START_MARKER = "=== harnessrl: starting "  # written into a component's log at each start


class SupervisorError(RuntimeError):
    """A component did not become healthy, or crashed more often than its restart budget allows."""


@dataclass
class ProcessSpec:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    health_url: str | None = None
    # How long a start may take before it counts as failed (vLLM on a CPU loads for tens of seconds).
    start_timeout_s: float = 120.0
    # A component whose exit with status 0 means the run is over (the learner after its last step).
    finishes_run: bool = False
    # A component that exits 0 when its work is done (a runner told by the coordinator) is not restarted.
    done_on_clean_exit: bool = False


@dataclass
class Managed:
    spec: ProcessSpec
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    exit_codes: list[int] = field(default_factory=list)


class Supervisor:
    def __init__(self, restart_budget: int = 3, poll_s: float = 0.5, pid_file: Path | None = None) -> None:
        self.restart_budget = restart_budget
        self.poll_s = poll_s
        # name -> pid of every live component, rewritten on each (re)start: for operators and tests.
        self.pid_file = pid_file
        self.procs: list[Managed] = []

    def start(self, spec: ProcessSpec) -> Managed:
        managed = Managed(spec)
        self.procs.append(managed)
        self._launch(managed)
        return managed

    def _launch(self, managed: Managed) -> None:
        spec = managed.spec
        spec.log.parent.mkdir(parents=True, exist_ok=True)
        with spec.log.open("ab") as log:
            log.write(f"\n{START_MARKER}{spec.name}: {' '.join(spec.argv)}\n".encode())
            log.flush()
            managed.popen = subprocess.Popen(
                spec.argv,
                env={**os.environ, **spec.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._write_pids()
        if spec.health_url is not None:
            self._wait_healthy(managed)

    def _write_pids(self) -> None:
        if self.pid_file is not None:
            pids = {m.spec.name: m.popen.pid for m in self.procs if m.popen is not None}
            tmp = self.pid_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(pids, indent=2) + "\n")
            tmp.replace(self.pid_file)

    def _wait_healthy(self, managed: Managed) -> None:
        spec, popen = managed.spec, managed.popen
        assert popen is not None and spec.health_url is not None
        deadline = time.monotonic() + spec.start_timeout_s
        while time.monotonic() < deadline:
            if popen.poll() is not None:
                raise SupervisorError(f"{spec.name} exited with status {popen.returncode} while starting; see {spec.log}")
            try:
                if httpx.get(spec.health_url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(self.poll_s)
        raise SupervisorError(f"{spec.name} not healthy at {spec.health_url} after {spec.start_timeout_s:.0f} s; see {spec.log}")

    def check(self) -> bool:
        """Restart crashed components; True once a run-finishing component has exited cleanly."""
        for managed in self.procs:
            popen = managed.popen
            if popen is None or popen.poll() is None:
                continue
            code = popen.returncode
            managed.exit_codes.append(code)
            if code == 0 and managed.spec.finishes_run:
                return True
            if code == 0 and managed.spec.done_on_clean_exit:
                managed.popen = None
                continue
            if code == EXIT_FAILED:
                # The component said no restart can help (the learner's LearnerFailure): stop with its reason.
                raise SupervisorError(f"{managed.spec.name} failed and is not restarted: {_last_line(managed.spec.log)}")
            if managed.restarts >= self.restart_budget:
                raise SupervisorError(
                    f"{managed.spec.name} exited with status {code} and has used its {self.restart_budget} "
                    f"restarts; see {managed.spec.log}"
                )
            managed.restarts += 1
            error = last_error(_log_tail(managed.spec.log))
            print(f"harnessrl: {managed.spec.name} exited with status {code}; restarting "
                  f"({managed.restarts}/{self.restart_budget})"
                  + (f"; its last error: {error} (see {managed.spec.log})" if error else ""), flush=True)
            self._launch(managed)
        return False

    def find(self, name: str) -> Managed:
        return next(m for m in self.procs if m.spec.name == name)

    def replace(self, name: str, spec: ProcessSpec, grace_s: float = 15.0) -> None:
        """Stop a component and start it again as `spec` (a planned restart, e.g. an engine on new weights):
        it does not count against the restart budget."""
        managed = self.find(name)
        _signal_group(managed.popen, signal.SIGTERM)
        _reap(managed.popen, time.monotonic() + grace_s)
        managed.spec = spec
        self._launch(managed)

    def stop_all(self, grace_s: float = 15.0, say: Callable[[str], None] | None = None,
                 every_s: float = 3.0) -> None:
        """SIGTERM every component in reverse start order, then SIGKILL what is left after `grace_s`. `say` hears
        what happens meanwhile: which components it stops, each one as it ends, and every `every_s` seconds
        which it still waits for."""
        tell = say or (lambda line: None)
        live = {m.spec.name: m.popen for m in reversed(self.procs) if m.popen is not None and m.popen.poll() is None}
        for managed in reversed(self.procs):
            _signal_group(managed.popen, signal.SIGTERM)
        if live:
            tell(f"stopping {', '.join(live)} (each gets {grace_s:.0f} s, then is killed)")
        started = time.monotonic()
        next_note = started + every_s
        while live and time.monotonic() < started + grace_s:
            time.sleep(0.1)
            for name, popen in [(n, p) for n, p in live.items() if p.poll() is not None]:
                del live[name]
                tell(f"{name} stopped (exit status {popen.returncode}) after {time.monotonic() - started:.1f} s")
            if live and time.monotonic() >= next_note:
                tell(f"still waiting for {', '.join(live)} ({time.monotonic() - started:.0f} s of {grace_s:.0f} s)")
                next_note += every_s
        for name in live:
            tell(f"{name} did not stop in {grace_s:.0f} s: killed")
        # SIGKILL every group: it may hold children even after its leader has exited.
        for managed in reversed(self.procs):
            _reap(managed.popen, started)


# An exception as Python prints it last in a traceback ("pkg.mod.SomeError: message"), wherever a logger's prefix
# puts it in the line.
_EXCEPTION = re.compile(r"\b(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b: .*")
LOG_TAIL_BYTES = 256 * 1024


def last_error(log_text: str) -> str | None:
    """The last exception line since the component's last start (the supervisor's start marker), if any: why a
    process exited is told beside its restart, not only in its log (vLLM exits 0 when its worker dies)."""
    since_start = log_text.rsplit(START_MARKER, 1)[-1]
    found = [m.group(0).strip() for m in _EXCEPTION.finditer(since_start)]
    return found[-1][:300] if found else None


def _log_tail(log: Path) -> str:
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - LOG_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _last_line(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return f"see {log}"
    return f"{lines[-1] if lines else ''} (see {log})"


def _reap(popen: subprocess.Popen[bytes] | None, deadline: float) -> None:
    """Wait for a signalled component until `deadline`, then SIGKILL its group."""
    if popen is None:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout=max(0.1, deadline - time.monotonic()))
    # The group may hold children even after the leader has exited.
    _signal_group(popen, signal.SIGKILL)
    popen.wait()


def _signal_group(popen: subprocess.Popen[bytes] | None, sig: signal.Signals) -> None:
    if popen is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)
