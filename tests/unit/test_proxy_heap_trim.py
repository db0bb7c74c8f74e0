"""Giving the heap's free pages back to the OS (heap_trim.py): when a trim is due, and that glibc's `malloc_trim`
really lowers the RSS of a process whose heap is full of holes, as a replica's is after its calls and sessions
freed their large objects between live ones."""

from __future__ import annotations

import subprocess
import sys

import pytest
from harnessrl.runtime.proxy.heap_trim import HeapTrimmer, glibc_malloc_trim


def test_a_trim_is_due_every_every_s() -> None:
    pads: list[int] = []

    def trim(pad: int) -> int:
        pads.append(pad)
        return 1

    trimmer = HeapTrimmer(every_s=30.0, trim=trim, last=0.0)
    assert [trimmer.trim_if_due(now) for now in (10.0, 30.0, 45.0, 59.9, 60.0)] == [False, True, False, False, True]
    assert pads == [0, 0]


def test_without_malloc_trim_nothing_is_done() -> None:
    assert not HeapTrimmer(every_s=0.0, trim=None, last=0.0).trim_if_due(100.0)


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
assert HeapTrimmer(every_s=0.0, last=0.0).trim_if_due()
print(before, rss_mb())
"""


@pytest.mark.skipif(glibc_malloc_trim() is None, reason="the C library has no malloc_trim (not glibc)")
def test_malloc_trim_gives_the_holes_back() -> None:
    out = subprocess.run([sys.executable, "-c", _HOLES], capture_output=True, text=True, timeout=60, check=True)
    before, after = map(float, out.stdout.split())
    assert before - after > 30, (before, after)  # ~45 MB of the ~64 MB were freed
