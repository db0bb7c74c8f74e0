"""The replica's append-only journal: one JSON line per record, durable before a response is released.

A single writer thread owns the file: callers enqueue records and await a future that resolves once the
bytes are written and flushed (and fsync'd when `fsync=True`). The thread also encodes them (pydantic-core's
JSON encoder, ~5x the standard library's), so the event loop only enqueues. Records that arrive while a write
is in progress are committed together (group commit), so 500 calls/s cost far fewer than 500 fsyncs.
Compaction rewrites the file keeping only the records of live sessions (temp file, fsync, atomic rename).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic_core import PydanticSerializationError, to_json

_STOP = object()


class Journal:
    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab")
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="proxy-journal", daemon=True)
        self._thread.start()
        self.commits = 0
        self.records = 0

    @staticmethod
    def encode(record: dict[str, Any]) -> bytes:
        """One journal line. Non-finite floats are written as NaN/Infinity, which `json.loads` reads back."""
        return to_json(record, inf_nan_mode="constants") + b"\n"

    def append(self, record: dict[str, Any]) -> asyncio.Future[None]:
        """Queue a record (the caller must not change it afterwards: the writer thread encodes it later); the
        returned future resolves once it is durable, or fails with the I/O or encoding error."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._queue.put((record, future, loop))
        return future

    def compact(self, keep: Callable[[dict[str, Any]], bool]) -> asyncio.Future[None]:
        """Rewrite the journal with only the records `keep` accepts, in order with the appends around it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._queue.put((keep, future, loop))
        return future

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout=10)
        self._file.close()

    # -- writer thread

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            pending: list[tuple[bytes, asyncio.Future[None], asyncio.AbstractEventLoop]] = []
            for item in batch:
                if item is _STOP:
                    self._commit(pending)
                    return
                if callable(item[0]):
                    self._commit(pending)
                    pending = []
                    self._settle([(item[1], item[2])], self._rewrite, item[0])
                    continue
                record, future, loop = item
                try:
                    pending.append((self.encode(record), future, loop))
                except (PydanticSerializationError, TypeError, ValueError) as exc:
                    loop.call_soon_threadsafe(_resolve, future, exc)
            self._commit(pending)

    def _commit(self, pending: list[tuple[bytes, asyncio.Future[None], asyncio.AbstractEventLoop]]) -> None:
        if not pending:
            return

        def write() -> None:
            self._file.write(b"".join(data for data, _, _ in pending))
            self._file.flush()
            if self._fsync:
                os.fsync(self._file.fileno())
            self.commits += 1
            self.records += len(pending)

        self._settle([(f, loop) for _, f, loop in pending], write)

    @staticmethod
    def _settle(
        waiters: list[tuple[asyncio.Future[None], asyncio.AbstractEventLoop]], work: Callable[..., None], *args: Any
    ) -> None:
        error: BaseException | None = None
        try:
            work(*args)
        except OSError as exc:
            error = exc
        # One wake-up of each waiting event loop per commit, not one per record: each is a syscall and a
        # callback on the loop, and a group commit may hold hundreds of records.
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for future, loop in waiters:
            by_loop.setdefault(loop, []).append(future)
        for loop, futures in by_loop.items():
            loop.call_soon_threadsafe(_resolve_all, futures, error)

    def _rewrite(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        tmp = self.path.with_suffix(self.path.suffix + ".compact")
        with tmp.open("wb") as out:
            for record in read_records(self.path):
                if keep(record):
                    out.write(self.encode(record))
            out.flush()
            os.fsync(out.fileno())
        self._file.close()
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._file = self.path.open("ab")


def _resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _resolve_all(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for future in futures:
        _resolve(future, error)


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
