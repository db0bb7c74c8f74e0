"""Giving the heap's free pages back to the OS now and then (glibc's `malloc_trim`).

A session keeps replacing its large objects (the last request body, its upstream messages' JSON, the known prompt
ids' text: tens of KB each by its twentieth turn), and every call allocates and frees more of that size. glibc
gives freed memory back to the OS only from the top of its heap, so the free pages between live chunks stay
resident: a replica's RSS follows its peak, not its live sessions, and stays there after they end. `malloc_trim(0)`
releases those pages: at 500 sessions @ 2 s it took a worker from 156 to 136 MB in 6-7 ms of CPU, at 5,000 @ 10 s
from 929 to 825 MB in 34 ms (7-11% each time, every 30 s there). Its cost is the pages it gives back (the kernel
unmaps them), not the heap's size: a second trim right after the first took 3.7 ms where the first took 52 ms (a
658 MB heap with 493 MB free). So it runs often, every 10 s in a task of its own, and a replica's RSS stays near
its live sessions' memory rather than its last peak. It runs on the event loop, which waits for it: at ~250
calls/s a worker delays up to ~10 calls in 2,500 (0.4%) by up to that long, far from its p99. Elsewhere than
glibc (musl, macOS) there is no such call and nothing is done; nor on mimalloc (the proxy's allocator where it is
installed, allocator.py), which gives freed pages back by itself.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harnessrl.runtime.proxy.allocator import mimalloc_loaded

log = logging.getLogger("harnessrl.proxy")


def glibc_malloc_trim() -> Callable[[int], int] | None:
    """The C library's `malloc_trim(pad)`, or None where the process's C library has none or it does not allocate
    the process's memory (mimalloc does)."""
    if mimalloc_loaded():
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


@dataclass
class HeapTrimmer:
    """Trims the heap every `every_s` while `run` runs (a task beside the proxy's sweeper)."""

    every_s: float = 10.0
    trim: Callable[[int], int] | None = field(default_factory=glibc_malloc_trim)

    def trim_now(self) -> None:
        if self.trim is None:
            return
        started = time.perf_counter()
        self.trim(0)
        log.debug("heap trimmed in %.1f ms", (time.perf_counter() - started) * 1000)

    async def run(self) -> None:
        """Until cancelled; returns at once where there is no `malloc_trim`."""
        while self.trim is not None:
            await asyncio.sleep(self.every_s)
            self.trim_now()


TRIMMER = HeapTrimmer()
