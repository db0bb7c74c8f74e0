"""`wait_until`: wait for an event by polling its condition against a deadline, instead of sleeping a fixed
time and hoping it happened. A plain module (not in tests/fixtures/), so any test imports it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, detail: Callable[[], Any] = lambda: "",
               poll_s: float = 0.05) -> None:
    """Return once `condition()` is truthy; fail with `what` (and `detail()`) if `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{detail()}")
        time.sleep(poll_s)


async def wait_until_async(condition: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.01) -> None:
    """`wait_until` for a test running in an event loop: the loop keeps running while it waits."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(poll_s)
