"""Work the training step must not wait for (a Hub upload of a checkpoint), in one background thread.

The queue is bounded at one waiting item, and a newer item replaces a waiting one: a slow Hub makes exports
skip checkpoints (a skipped one cannot become main's best) instead of piling up behind training. The work must be idempotent and resumable by itself: a crash loses at most the item in flight,
and the restarted learner exports its latest checkpoint again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class LatestOnlyWorker(Generic[T]):
    def __init__(self, work: Callable[[T], None], name: str):
        self.work = work
        self._cond = threading.Condition()
        self._waiting: T | None = None
        self._busy = False
        self._closed = False
        self.replaced = 0  # items dropped for a newer one (for logs and tests)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: T) -> None:
        with self._cond:
            if self._waiting is not None:
                self.replaced += 1
            self._waiting = item
            self._cond.notify_all()

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until nothing is waiting or running; False if `timeout_s` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._waiting is None and not self._busy, timeout_s)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._waiting is not None or self._closed)
                if self._waiting is None:
                    return
                item, self._waiting, self._busy = self._waiting, None, True
            try:
                self.work(item)
            except Exception:  # the work reports its own failures; the worker must outlive any one of them
                log.exception("background work failed")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
