"""Write-ahead journal of accepted completions, so a crash after a checkpoint loses nothing completed.

One JSON line per accepted completion (with the sequences fetched for it), written and flushed before the
runner gets its ack. On restart the coordinator state comes from the checkpoint and the entries after its
`journal_seq` are applied again, in order; the coordinator's own duplicate checks keep each counted once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from harnessrl.runtime.contracts.coordinator import Completion
from harnessrl.runtime.trajectory.models import TrainingSequence
from pydantic import BaseModel


class JournalEntry(BaseModel):
    seq: int
    harness: str = ""  # the group's harness, for reports (absent in journals written before it was recorded)
    completion: Completion
    sequences: list[TrainingSequence]


class Journal:
    def __init__(self, path: Path, fsync: bool = True):
        self.path = path
        self.fsync = fsync
        path.parent.mkdir(parents=True, exist_ok=True)
        self._truncate_torn_tail()
        self._fh = path.open("a", encoding="utf-8")

    def _truncate_torn_tail(self) -> None:
        # A kill mid-write leaves a partial last line; it was never acked, so dropping it is correct.
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            with self.path.open("r+b") as fh:
                fh.truncate(end)

    def append(self, entry: JournalEntry) -> None:
        self._fh.write(entry.model_dump_json(exclude_computed_fields=True) + "\n")
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())

    def entries_after(self, seq: int) -> Iterator[JournalEntry]:
        with self.path.open(encoding="utf-8") as fh:
            for line in fh:
                entry = JournalEntry.model_validate_json(line)
                if entry.seq > seq:
                    yield entry

    def close(self) -> None:
        self._fh.close()
