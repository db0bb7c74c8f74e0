"""The reconcile queue: level-based and keyed by object.

Any event about an object (its own, a child's, a related object's) only *triggers* a reconcile of its key, which
re-reads everything. Triggers for a key that is already being reconciled coalesce into one more pass, so a burst
of events costs at most two passes and two passes of one key never overlap. That pass goes to the back of the
queue: a key kept busy by its own children's events cannot hold a worker while other keys wait (fair queueing).
A resync thread triggers every known key periodically, which is what restores a child deleted while nobody was
watching and refreshes progress.

While this replica does not lead (leader.py), triggers are dropped; `lead` reconciles everything known at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kubernetes.client.exceptions import ApiException

log = logging.getLogger("harnessrl.operator")
Key = tuple[str, str, str]  # (kind, namespace, name)
# After each pass: its kind, its outcome (ok, api_error, error) and how long it took.
Observe = Callable[[str, str, float], None]


class ReconcileQueue:
    def __init__(self, reconcile: Callable[[Key], None], workers: int, resync_seconds: float,
                 observe: Observe = lambda kind, outcome, seconds: None) -> None:
        self.reconcile, self.workers, self.resync_seconds, self.observe = reconcile, workers, resync_seconds, observe
        self.known: set[Key] = set()
        self._mu = threading.Lock()
        self._running: set[Key] = set()
        self._dirty: set[Key] = set()
        self._executor: ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        self._resync: threading.Thread | None = None
        self._leading = threading.Event()

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="harnessrl-reconcile")
        self._resync = threading.Thread(target=self._resync_loop, name="harnessrl-resync", daemon=True)
        self._resync.start()

    def stop(self) -> None:
        self._stop.set()
        if self._resync is not None:
            self._resync.join(timeout=5)
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def lead(self) -> None:
        self._leading.set()
        self.trigger_all()

    def follow(self) -> None:
        self._leading.clear()  # passes in flight finish; nothing new starts

    # -- triggers ---------------------------------------------------------------------------------------
    def seen(self, key: Key, *, deleted: bool = False) -> None:
        with self._mu:
            if deleted:
                self.known.discard(key)
            else:
                self.known.add(key)
        if not deleted:
            self.trigger(key)

    def trigger(self, key: Key) -> None:
        with self._mu:
            if key in self._running:
                self._dirty.add(key)
                return
            if self._executor is None or not self._leading.is_set():
                return
            self._running.add(key)
            self._executor.submit(self._run, key)

    def trigger_namespace(self, kind: str, namespace: str) -> None:
        with self._mu:
            keys = [k for k in self.known if k[0] == kind and k[1] == namespace]
        for key in keys:
            self.trigger(key)

    def trigger_all(self) -> None:
        with self._mu:
            keys = sorted(self.known)
        for key in keys:
            self.trigger(key)

    def busy(self) -> bool:
        """Some reconcile is running or queued."""
        with self._mu:
            return bool(self._running)

    def depth(self) -> float:
        return float(len(self._running))

    def count(self, kind: str) -> float:
        return float(sum(1 for key in list(self.known) if key[0] == kind))

    def _run(self, key: Key) -> None:
        kind, namespace, name = key
        outcome, started = "ok", time.monotonic()
        try:
            self.reconcile(key)
        except ApiException as exc:  # the API is unreachable or busy (5xx, 409, 429): the resync retries it
            outcome = "api_error"
            log.warning("reconcile of %s %s/%s: API error %s %s; retrying", kind, namespace, name, exc.status, exc.reason)
        except Exception:  # a bug: one object's failure must not stop the others; the resync retries it
            outcome = "error"
            log.exception("reconcile of %s %s/%s failed", kind, namespace, name)
        self.observe(kind, outcome, time.monotonic() - started)
        with self._mu:
            if key in self._dirty and not self._stop.is_set() and self._executor is not None and self._leading.is_set():
                self._dirty.discard(key)
                self._executor.submit(self._run, key)  # still running (no overlap), queued behind the others
                return
            self._dirty.discard(key)
            self._running.discard(key)

    def _resync_loop(self) -> None:
        while not self._stop.wait(self.resync_seconds):
            self.trigger_all()
