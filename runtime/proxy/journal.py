"""The replica's append-only journal: one JSON line per record, durable before a response is released.

A record is encoded (pydantic-core, ~5x the standard library's encoder) and buffered on the event loop; once per
loop iteration everything buffered goes to the file in one `write`, which alone survives a killed process (the
page cache outlives it). With `fsync=True` the waiting calls resolve only once an fsync covering their bytes has
returned, and one fsync covers everything written before it (group commit: 500 calls/s cost far fewer than 500
fsyncs).

Where the fsync runs depends on how long the last one took. While the disk is fast (under `INLINE_SYNC_MAX_S`),
it runs right after the write, on the loop: handing it to a thread and back cost more CPU than the fsync itself
(~114 µs against ~90 µs here), and with a replica's load split over several workers a commit covers
one or two records, so that hand-off was paid on almost every call. Once an fsync is slow, they run one at a time
in a helper thread, records written meanwhile waiting for the next, so a slow disk never stalls the loop; the
first fast one there brings them back.

A commit may also wait a little for records still to come (`hold_commits`, after PostgreSQL's `commit_delay` and
`commit_siblings`; off by default): while calls are in flight that have not appended yet, the fsync waits up to the
commit delay for them, and one fsync covers them all. It trades latency for CPU: at 1,000 sessions @ 2 s a 2 ms
delay cut the proxy's CPU per call by ~6-9% (fewer fsyncs, and calls handled in bigger batches), but calls released
together by one fsync come back together after the benchmark's fixed pause, so the bursts grew and p99 added rose
2-3.5x (benchmarks/proxy/README.md, History). With one call in flight nothing is held.

Why not a writer thread that owns the file: every record was a hand-off to it, and a thread that
needs the GIL while the loop is busy waits out the interpreter's switch interval, so under load a record's
durability waited on the GIL rather than on the disk.

Compaction rewrites the file keeping only the records of live sessions (temp file, fsync, atomic rename) in the
helper thread; records appended meanwhile stay buffered and go to the new file after it.

The file is kept zero-filled ahead of its records (`PREFILL_BYTES`, written and synced in the helper thread), and
a commit is an fdatasync: records then land in blocks the file already has, so a commit writes only their pages.
An append that grows the file also makes every fsync write the inode and the block map, two device writes
instead of one on ext4 here: the prefilled file cut the proxy's CPU per call by ~3% at 1,000 sessions @ 2 s
(benchmarks/proxy/README.md, History). Readers stop at the zero tail (it holds no newline), and a clean close
trims it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic_core import PydanticSerializationError, to_json

# An fsync that took longer than this sends the next ones to the helper thread (see the module's docstring).
# Pays: p99 added 27-70 -> 16-22 ms at 1,000 sessions @ 2 s against always in the thread (benchmarks/proxy/README.md, History).
INLINE_SYNC_MAX_S = 0.005
# How far past its records the file is zero-filled; a new stretch is filled once less than half of it is left.
# Pays: a commit writes one block, −3% CPU per call at 1,000 sessions @ 2 s (benchmarks/proxy/README.md, History).
PREFILL_BYTES = 4 << 20


class Journal:
    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._end = _records_end(self._fd)  # where the next record goes
        self._filled = os.fstat(self._fd).st_size  # the file's size: zeros from `_end` to here
        self._prefilling = False  # the helper thread is zero-filling the file past `_filled`
        self._generation = 0  # of the file: each compaction makes a new one
        self._disk = ThreadPoolExecutor(max_workers=1, thread_name_prefix="proxy-journal")
        self._buffer: list[bytes] = []
        self._writing: list[asyncio.Future[None]] = []  # waiting for the next write
        self._syncing: list[asyncio.Future[None]] = []  # written, waiting for the next fsync
        self._flush_scheduled = False
        self._disk_busy = False  # an fsync or a compaction runs in the helper thread
        self._compacting = False  # the file is being replaced: nothing may be written to it
        self._compactions: list[tuple[Callable[[dict[str, Any]], bool], asyncio.Future[None]]] = []
        self.sync_inline = True  # the last fsync was fast: the next runs on the loop
        self._commit_delay_s = 0.0
        self._in_flight: Callable[[], int] = lambda: 0
        self._commit_timer: asyncio.TimerHandle | None = None  # set while a commit waits for more records
        self.commits = 0
        self.records = 0

    @staticmethod
    def encode(record: dict[str, Any]) -> bytes:
        """One journal line. Non-finite floats are written as NaN/Infinity, which `json.loads` reads back."""
        return to_json(record, inf_nan_mode="constants") + b"\n"

    def append(self, record: dict[str, Any]) -> asyncio.Future[None]:
        """Buffer a record; the returned future resolves once it is durable, or fails with the I/O or encoding
        error (a record that cannot be encoded fails alone)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        try:
            self._buffer.append(self.encode(record))
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            future.set_exception(exc)
            return future
        self._writing.append(future)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    def hold_commits(self, delay_s: float, in_flight: Callable[[], int]) -> None:
        """Hold an fsync up to `delay_s` while fewer records wait for it than `in_flight()` calls are in flight
        (each ends by appending one); the fsync runs as soon as they have all appended."""
        self._commit_delay_s, self._in_flight = delay_s, in_flight

    def compact(self, keep: Callable[[dict[str, Any]], bool]) -> asyncio.Future[None]:
        """Rewrite the journal with only the records `keep` accepts, in order with the appends around it."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._compactions.append((keep, future))
        self._flush()
        return future

    def close(self) -> None:
        """Write what is buffered and wait for the helper thread (at shutdown; the loop may be gone)."""
        self._disk.shutdown(wait=True)
        if self._commit_timer is not None:
            self._commit_timer.cancel()
        unsynced = bool(self._buffer or self._syncing)  # the latter written by a commit still held
        if self._buffer:
            self._end = _write_all(self._fd, b"".join(self._buffer), self._end)
            self._buffer.clear()
        trim = os.fstat(self._fd).st_size > self._end
        if trim:
            os.ftruncate(self._fd, self._end)
        if self._fsync and (unsynced or trim):
            os.fsync(self._fd)
        os.close(self._fd)

    # -- on the event loop

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._compacting:
            return  # appends stay buffered until the compaction is done
        # Records that would go past what is filled wait while the helper thread fills it.
        if self._buffer and not (self._prefilling and self._end + sum(map(len, self._buffer)) > self._filled):
            data, writing = b"".join(self._buffer), self._writing
            self._buffer, self._writing = [], []
            try:
                self._end = _write_all(self._fd, data, self._end)
                self._filled = max(self._filled, self._end)
            except OSError as exc:
                _settle(writing, exc)
            else:
                self.records += len(writing)
                if self._fsync:
                    self._syncing.extend(writing)
                else:
                    self.commits += 1
                    _settle(writing, None)
        if self._syncing and self.sync_inline and not self._disk_busy and not self._holding():
            self._sync_on_loop()
        self._start_disk_work()

    def _holding(self) -> bool:
        """Whether the written records' fsync waits for calls in flight to append theirs (`hold_commits`): until
        they all have, or the timer the first held record set runs it."""
        if self._commit_delay_s <= 0 or len(self._syncing) >= self._in_flight():
            return False
        if self._commit_timer is None:
            self._commit_timer = asyncio.get_running_loop().call_later(self._commit_delay_s, self._commit_held)
        return True

    def _commit_held(self) -> None:
        self._commit_timer = None
        if self._syncing and self.sync_inline and not self._disk_busy:
            self._sync_on_loop()
        # Otherwise the helper thread is busy, and its end flushes again.

    def _take_syncing(self) -> list[asyncio.Future[None]]:
        """The records written since the last fsync, for the fsync about to run; a held commit stops waiting."""
        if self._commit_timer is not None:
            self._commit_timer.cancel()
            self._commit_timer = None
        waiters, self._syncing = self._syncing, []
        return waiters

    def _sync_on_loop(self) -> None:
        waiters = self._take_syncing()
        try:
            self._timed_fsync(self._fd)
        except OSError as exc:
            _settle(waiters, exc)
            return
        self.commits += 1
        _settle(waiters, None)

    def _timed_fsync(self, fd: int) -> None:
        """An fsync, on the loop or in the helper thread; how long it took decides where the next one runs (the
        loop reads `sync_inline` only while the helper thread is idle)."""
        started = time.perf_counter()
        os.fdatasync(fd)
        self.sync_inline = time.perf_counter() - started < INLINE_SYNC_MAX_S

    def _start_disk_work(self) -> None:
        if self._disk_busy:
            return
        work: Callable[[], None]
        if self._compactions:
            keep, future = self._compactions.pop(0)
            waiters = [*self._take_syncing(), future]
            self._compacting = True
            work = functools.partial(self._rewrite, keep)
        elif self._syncing and not self.sync_inline:
            waiters = self._take_syncing()
            work = functools.partial(self._timed_fsync, self._fd)
        else:
            self._start_prefill()
            return
        self._disk_busy = True
        self._disk.submit(self._run_disk_work, work, waiters, asyncio.get_running_loop())

    def _start_prefill(self) -> None:
        """Zero-fill the next stretch past the file's end in the helper thread, while the loop's commits go on below
        it (not as disk work: that would send them to the thread)."""
        if not self._fsync or self._prefilling or self._filled - self._end >= PREFILL_BYTES // 2:
            return
        self._prefilling = True
        self._disk.submit(self._prefill, self._fd, self._generation, self._filled, asyncio.get_running_loop())

    def _prefilled(self, generation: int, filled: int) -> None:
        self._prefilling = False
        if generation == self._generation:  # else a compaction since made a new file, and set its own
            self._filled = max(self._filled, filled)
        self._flush()

    def _disk_done(self, waiters: list[asyncio.Future[None]], error: BaseException | None) -> None:
        self._disk_busy = self._compacting = False
        self.commits += 1
        _settle(waiters, error)
        self._flush()

    # -- in the helper thread

    def _run_disk_work(
        self, work: Callable[[], None], waiters: list[asyncio.Future[None]], loop: asyncio.AbstractEventLoop
    ) -> None:
        """Run an fsync or a compaction and hand the outcome straight back to the loop as one callback. Through
        `run_in_executor` and a done-callback it took two more loop iterations, and under saturation a response's
        wait for durability is counted in loop iterations."""
        error: BaseException | None = None
        try:
            work()
        except Exception as exc:  # the waiters fail with it, on the loop
            error = exc
        loop.call_soon_threadsafe(self._disk_done, waiters, error)

    def _prefill(self, fd: int, generation: int, start: int, loop: asyncio.AbstractEventLoop) -> None:
        """Zero-fill PREFILL_BYTES from `start` and sync it. A failure (a full disk) only means records grow the
        file again; their own writes say so if it matters."""
        try:
            filled = _write_all(fd, bytes(PREFILL_BYTES), start)
            os.fdatasync(fd)
        except OSError:
            filled = start
        loop.call_soon_threadsafe(self._prefilled, generation, filled)

    def _rewrite(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        """Everything already written is in the file; the rewrite's fsync also covers it."""
        tmp = self.path.with_suffix(self.path.suffix + ".compact")
        with tmp.open("wb") as out:
            for record in read_records(self.path):
                if keep(record):
                    out.write(self.encode(record))
            end = out.tell()
            if self._fsync:
                out.write(bytes(PREFILL_BYTES))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        old, self._fd = self._fd, os.open(self.path, os.O_RDWR)
        self._end, self._filled = end, os.fstat(self._fd).st_size
        self._generation += 1
        os.close(old)


def _write_all(fd: int, data: bytes, offset: int) -> int:
    """Write `data` at `offset`; returns where it ends."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
    return offset


def _records_end(fd: int) -> int:
    """Where a journal file's records end: its size less the zero-filled tail."""
    end = os.fstat(fd).st_size
    while end > 0:
        block = os.pread(fd, min(end, 1 << 16), end - min(end, 1 << 16))
        kept = block.rstrip(b"\0")
        if kept:
            return end - len(block) + len(kept)
        end -= len(block)
    return 0


def _settle(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for future in futures:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete record of a journal, in order. A torn last line (the process died mid-write, so that
    response was never released) is skipped."""
    if not path.exists():
        return
    with path.open("rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                return
            try:
                yield json.loads(line)
            except ValueError:
                continue
