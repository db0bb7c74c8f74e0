"""Loopback servers that tests start: `free_port()` picks a port for one, and `wait_serving()` waits until the
process behind it answers its health URL, and `stop_process()` stops it by its PID. A plain module, not in tests/fixtures/, so the fixture plugins can
import it at load time without pytest warning that it was imported before it could be rewritten."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

from harnessrl.runtime.ports import free_ports

__all__ = ["free_port", "free_ports", "stop_process", "wait_serving"]


def free_port() -> int:
    """A port nothing listens on right now (the OS picks it; the caller binds it soon after)."""
    return free_ports()


def wait_serving(health_url: str, proc: subprocess.Popen[bytes], timeout_s: float, what: str,
                 log: Callable[[], str], poll_s: float = 0.1) -> None:
    """Return once `health_url` answers 200; raise with `what` and the log's tail if `proc` exits or
    `timeout_s` passes first."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} during startup:\n{log()}")
        try:
            if httpx.get(health_url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    raise RuntimeError(f"{what} not healthy after {timeout_s:.0f} s:\n{log()}")


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """SIGTERM (a program cleans up, as on a Pod's deletion), then SIGKILL after `grace_s`."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
