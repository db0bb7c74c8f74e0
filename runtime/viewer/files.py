"""Reading a journal a run is still appending to: only the lines added since the last read.

Both journals the viewer reads are append-only JSON lines, so a reader keeps its byte offset and reads on from
there; a record is only taken once its newline is there (the writer's last line may be torn). The proxy keeps its
file zero-filled ahead of its records (runtime/proxy/journal.py): a line starting with a NUL byte is that tail.
A file that got shorter or was replaced (the proxy's compaction renames a new file over it) is read again from
its start, and its reader drops what it built from it, since those offsets no longer hold.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Tail:
    path: Path
    offset: int = 0  # where the next unread record starts
    inode: int | None = None

    def unchanged(self) -> bool:
        """Whether the file is still the one read so far: the same inode, and no shorter."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return False
        return stat.st_ino == self.inode and stat.st_size >= self.offset

    def rewound(self) -> bool:
        """Whether the file must be read again from its start (new, replaced or shorter); then it will be."""
        if not self.path.exists() or self.unchanged():
            return False
        self.inode, self.offset = os.stat(self.path).st_ino, 0
        return True

    def new_lines(self) -> Iterator[tuple[int, bytes]]:
        """(offset, line) for each whole record appended since the last call."""
        if not self.path.exists():
            return
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            for line in fh:
                if not line.endswith(b"\n") or line.startswith(b"\0"):
                    return
                yield self.offset, line
                self.offset += len(line)


def read_line(path: Path, offset: int) -> bytes:
    """The record that starts at `offset`."""
    with path.open("rb") as fh:
        fh.seek(offset)
        return fh.readline()
