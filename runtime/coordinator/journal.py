"""The write-ahead journal of every coordinator: accepted completions, one JSON line each, fsync'd before the ack.

One crash behaviour. A record is one `write` of its JSON and a newline, so a process killed while writing leaves
at most one partial last line, without its newline, and that record was never acknowledged: on open it is cut off
(the file truncated to the last newline) and logged with the file and byte offset; everything before it replays.
A newline-terminated line that does not parse, anywhere in the file, is not what a crash leaves: replay stops with
`JournalCorrupt` naming the file and the line, instead of silently dropping records that were acknowledged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

from harnessrl.runtime.contracts.coordinator import Completion
from harnessrl.runtime.trajectory.models import TrainingSequence
from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)


class JournalEntry(BaseModel):
    seq: int  # 1, 2, ... in the order the completions were applied
    harness: str = ""  # the rollout's harness, for reports
    completion: Completion
    sequences: list[TrainingSequence]  # fetched for a scored training rollout, else empty


class JournalCorrupt(RuntimeError):
    """A journal line that is neither a record nor a torn last write."""


def _cut_torn_tail(path: Path) -> None:
    size = path.stat().st_size
    if size == 0:
        return
    with path.open("r+b") as fh:
        # Walk back from the end to the last newline; a record is rarely longer than a few MB.
        end, chunk = size, 1 << 16
        while end > 0:
            start = max(0, end - chunk)
            fh.seek(start)
            block = fh.read(end - start)
            if end == size and block.endswith(b"\n"):
                return
            nl = block.rfind(b"\n")
            if nl >= 0:
                cut = start + nl + 1
                break
            end = start
        else:
            cut = 0
        fh.truncate(cut)
        fh.flush()
        os.fsync(fh.fileno())
    log.warning("journal %s: dropped a torn last record at byte %d (%d bytes, never acknowledged)", path, cut, size - cut)


def read_entries(path: Path) -> Iterator[JournalEntry]:
    """The records of a journal, in order, without changing the file (for readers such as reports): a torn last
    line is skipped with a warning; `JournalCorrupt` at the first whole line that is not a record."""
    with path.open("rb") as fh:
        offset = 0
        for n, line in enumerate(fh, 1):
            if not line.endswith(b"\n"):
                log.warning("journal %s: ignoring a torn last record at byte %d (%d bytes)", path, offset, len(line))
                return
            try:
                yield JournalEntry.model_validate_json(line)
            except ValidationError as exc:
                raise JournalCorrupt(f"journal {path}, line {n}: not a record ({exc.errors()[0]['msg']}); "
                                     "a crash only ever tears the last line, so this file was changed or "
                                     "damaged otherwise: repair or move it") from None
            offset += len(line)


class Journal:
    def __init__(self, path: Path, fsync: bool = True):
        self.path = path
        self.fsync = fsync
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            _cut_torn_tail(path)
        self._fh = path.open("ab")

    def append(self, entry: JournalEntry) -> None:
        self._fh.write(entry.model_dump_json(exclude_computed_fields=True).encode() + b"\n")
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())

    def entries(self) -> Iterator[JournalEntry]:
        """Every record, in order; `JournalCorrupt` at the first line that is not one."""
        return read_entries(self.path)

    def entries_after(self, seq: int) -> Iterator[JournalEntry]:
        return (e for e in self.entries() if e.seq > seq)

    def close(self) -> None:
        self._fh.close()
