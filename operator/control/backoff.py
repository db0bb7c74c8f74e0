"""Retry delays per object after a refusal only a change of the object can cure."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable


class Backoff:
    """Per-object retry delays after a refusal only a change can cure (a child the API server refuses, or one
    another owner holds): doubling from `first` up to `cap`; a new version of the object retries at once. The
    version is (uid, generation): an object deleted and created again under the same name starts afresh."""

    def __init__(self, first: float, cap: float = 300.0) -> None:
        self.first, self.cap = first, cap
        self._entries: dict[tuple[str, str], tuple[Hashable, int, float]] = {}  # key -> (version, failures, not before)
        self._mu = threading.Lock()

    def due(self, key: tuple[str, str], version: Hashable) -> bool:
        with self._mu:
            entry = self._entries.get(key)
            if entry is None or entry[0] != version:
                self._entries.pop(key, None)
                return True
            return time.monotonic() >= entry[2]

    def failed(self, key: tuple[str, str], version: Hashable) -> float:
        """Record a refusal; returns the delay before the next try."""
        with self._mu:
            entry = self._entries.get(key)
            failures = entry[1] + 1 if entry is not None and entry[0] == version else 1
            delay = min(self.first * 2 ** (failures - 1), self.cap)
            self._entries[key] = (version, failures, time.monotonic() + delay)
            return delay

    def succeeded(self, key: tuple[str, str]) -> None:
        with self._mu:
            self._entries.pop(key, None)
