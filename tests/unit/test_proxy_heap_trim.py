"""Giving the heap's free pages back to the OS (heap_trim.py): the trimmer's rounds, and that glibc's `malloc_trim`
really lowers the RSS of a process whose heap is full of holes, as a replica's is after its calls and sessions
freed their large objects between live ones."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys

import pytest
from harnessrl.runtime.proxy.heap_trim import HeapTrimmer, glibc_malloc_trim


def test_the_trimmer_trims_round_after_round_until_cancelled() -> None:
    pads: list[int] = []

    async def three_rounds() -> asyncio.Task[None]:
        third = asyncio.Event()

        def trim(pad: int) -> int:
            pads.append(pad)
            if len(pads) == 3:
                third.set()
            return 1

        task = asyncio.create_task(HeapTrimmer(every_s=0.01, trim=trim).run())
        await asyncio.wait_for(third.wait(), timeout=10)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return task

    assert asyncio.run(three_rounds()).cancelled()
    assert pads == [0, 0, 0]


def test_without_malloc_trim_the_trimmer_returns_at_once() -> None:
    asyncio.run(asyncio.wait_for(HeapTrimmer(every_s=0.0, trim=None).run(), timeout=5))


# 1,600 objects of 40 KB (under glibc's mmap threshold: they live in the heap), three of every four freed: their
# pages stay resident between the survivors until a trim gives them back.
_HOLES = """
from pathlib import Path
from harnessrl.runtime.proxy.heap_trim import HeapTrimmer

def rss_mb():
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20

blocks = [bytes([k % 256]) * 40_000 for k in range(1600)]
kept = blocks[::4]
del blocks
before = rss_mb()
HeapTrimmer().trim_now()
print(before, rss_mb())
"""


@pytest.mark.skipif(glibc_malloc_trim() is None, reason="the C library has no malloc_trim (not glibc)")
def test_malloc_trim_gives_the_holes_back() -> None:
    out = subprocess.run([sys.executable, "-c", _HOLES], capture_output=True, text=True, timeout=60, check=True)
    before, after = map(float, out.stdout.split())
    assert before - after > 30, (before, after)  # ~45 MB of the ~64 MB were freed
