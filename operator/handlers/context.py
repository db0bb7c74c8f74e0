"""What the handlers share: options, the API client, which runs and pools exist, and a reconcile queue.

Reconciliation is level-based and keyed by object: any event about a run (its own, a child's, a pool's)
only *triggers* a reconcile of that run, which re-reads everything. Triggers for a run that is already
being reconciled coalesce into one more pass, so a burst of events costs at most two passes and two
passes of one run never overlap. That pass goes to the back of the queue: a key kept busy by its own
children's events cannot hold a worker while other runs wait (fair queueing). A resync thread triggers
every known object periodically, which is what restores a child deleted while nobody was watching and
refreshes progress.

With leader election (operator/leader.py) every replica watches, and only the one holding the Lease
reconciles: triggers on the others are dropped, and the replica that becomes leader reconciles everything it
knows at once.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor

import kubernetes.client
from harnessrl.operator.api.enginepool import KIND as ENGINE_POOL_KIND
from harnessrl.operator.api.trainingrun import KIND as RUN_KIND
from harnessrl.operator.handlers.apply import Kube, path
from harnessrl.operator.handlers.cache import ChildCache, KindKey, OnChange
from harnessrl.operator.handlers.metrics import OperatorMetrics, PoolUsages, Usages
from harnessrl.operator.leader import Elector, LeaderElection, default_namespace
from harnessrl.operator.plan.types import Images
from harnessrl.runtime.contracts.coordinator import CoordinatorStatus
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("harnessrl.operator")
Key = tuple[str, str, str]  # (kind, namespace, name)


class OperatorOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    resync_seconds: float = Field(10.0, gt=0, le=3600, description="period of the level-based resync")
    images: Images = Images()
    # Where the operator reads a run's learner status; {run} and {namespace} are filled in.
    # Empty = the learner's Service DNS name (the operator runs in the cluster).
    learner_url_template: str = ""
    # Where the operator reaches an EnginePool's servers and their adapter stores, to unload the adapters of runs
    # that are gone; {pool}, {namespace} and {replica} are filled in. Empty = their Pods' DNS names.
    engine_pool_server_url_template: str = ""
    engine_pool_store_url_template: str = ""
    workers: int = Field(4, ge=1, le=64, description="reconciles running at once (different objects)")
    namespaces: list[str] = Field(default_factory=list, description="the watched namespaces; empty: all")
    request_timeout_s: float = Field(10.0, gt=0)
    leader_election: LeaderElection | None = Field(None, description="None: this replica always reconciles")
    # The runs' and pools' NetworkPolicies admit the operator's Pods in this namespace only (kube/network.py).
    operator_namespace: str = Field(default_factory=default_namespace, min_length=1, max_length=63)


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


class Context:
    def __init__(self, options: OperatorOptions, api: kubernetes.client.ApiClient) -> None:
        self.options = options
        self.kube = Kube(api, timeout=options.request_timeout_s)
        self.refusals = Backoff(options.resync_seconds)
        self.known: set[Key] = set()
        self.progress: dict[tuple[str, str], CoordinatorStatus] = {}  # (namespace, run) -> last learner status
        self.usage: Usages = {}  # (namespace, run) -> its status.usage as last written
        self.pool_usage: PoolUsages = {}  # (namespace, EnginePool) -> the same
        self._pool_users: dict[tuple[str, str], set[str]] = {}  # (namespace, pool) -> active runs using it
        self._reconcilers: dict[str, Callable[[Context, str, str], None]] = {}
        self._mu = threading.Lock()
        self._running: set[Key] = set()
        self._dirty: set[Key] = set()
        self._executor: ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        self._resync: threading.Thread | None = None
        self.metrics = OperatorMetrics()
        self.metrics.observe_queue(lambda: float(len(self._running)))
        self.metrics.observe_usage(lambda: dict(self.usage), lambda: dict(self.pool_usage))
        for kind in ("TrainingRun", "HarnessPool"):
            self.metrics.observe_known(kind, functools.partial(self._count, kind))
        self._leading = threading.Event()
        election = options.leader_election
        self._elector = Elector(self.kube, election, self._lead, self._follow) if election else None

    def register(self, kind: str, reconcile: Callable[[Context, str, str], None]) -> None:
        self._reconcilers[kind] = reconcile

    def cache_children(self, kinds: list[KindKey], label_selector: str, on_change: OnChange) -> None:
        """Read these kinds (the objects with `label_selector`) from a watched cache from `start` on."""
        scopes: list[str | None] = [*self.options.namespaces] or [None]
        self.kube.cache = ChildCache(self.kube, {k: {ns: path(*k, ns) for ns in scopes} for k in kinds},
                                     label_selector, on_change)

    # -- lifecycle (kopf startup / cleanup) ---------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        if self.kube.cache is not None:
            self.kube.cache.start()
            if not self.kube.cache.wait_synced(self.options.request_timeout_s):
                log.warning("some children are not listed yet; reconciles read those from the API server meanwhile")
        self._executor = ThreadPoolExecutor(self.options.workers, thread_name_prefix="harnessrl-reconcile")
        self._resync = threading.Thread(target=self._resync_loop, name="harnessrl-resync", daemon=True)
        self._resync.start()
        if self._elector is None:
            self._lead()
        else:
            self._elector.start()

    def stop(self) -> None:
        self._stop.set()
        if self.kube.cache is not None:
            self.kube.cache.stop()
        if self._elector is not None:
            self._elector.stop()
        if self._resync is not None:
            self._resync.join(timeout=5)
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def _lead(self) -> None:
        self._leading.set()
        self.metrics.leader.set(1)
        with self._mu:
            keys = sorted(self.known)
        for key in keys:
            self.trigger(key)

    def _follow(self) -> None:
        self._leading.clear()  # passes in flight finish; nothing new starts
        self.metrics.leader.set(0)

    def use_pools(self, namespace: str, run: str, pools: set[str]) -> set[str]:
        """Record the pools an active run uses; returns the other runs whose share of a pool changed."""
        with self._mu:
            changed = set()
            for (ns, pool), users in self._pool_users.items():
                if ns == namespace and (run in users) != (pool in pools):
                    changed.add(pool)
            changed |= {p for p in pools if (namespace, p) not in self._pool_users}
            for pool in changed:
                users = self._pool_users.setdefault((namespace, pool), set())
                if pool in pools:
                    users.add(run)
                else:
                    users.discard(run)
            return {r for pool in changed for r in self._pool_users[(namespace, pool)]} - {run}

    def pool_users(self, namespace: str, pool: str) -> set[str]:
        with self._mu:
            return set(self._pool_users.get((namespace, pool), ()))

    def _count(self, kind: str) -> float:
        return float(sum(1 for key in list(self.known) if key[0] == kind))

    # -- triggers ---------------------------------------------------------------------------------------
    def seen(self, kind: str, namespace: str, name: str, *, deleted: bool = False) -> None:
        key = (kind, namespace, name)
        with self._mu:
            if deleted:
                self.known.discard(key)
            else:
                self.known.add(key)
        if deleted:
            if kind == RUN_KIND:  # a HarnessPool or EnginePool may have a run's name
                self.progress.pop((namespace, name), None)
                self.usage.pop((namespace, name), None)
            elif kind == ENGINE_POOL_KIND:
                self.pool_usage.pop((namespace, name), None)
            self.kube.forget(kind, namespace, name)
        else:
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

    def busy(self) -> bool:
        """Some reconcile is running or queued."""
        with self._mu:
            return bool(self._running)

    def trigger_namespace(self, kind: str, namespace: str) -> None:
        with self._mu:
            keys = [k for k in self.known if k[0] == kind and k[1] == namespace]
        for key in keys:
            self.trigger(key)

    def _run(self, key: Key) -> None:
        kind, namespace, name = key
        outcome, started = "ok", time.monotonic()
        try:
            self._reconcilers[kind](self, namespace, name)
        except ApiException as exc:  # the API is unreachable or busy (5xx, 409, 429): the resync retries it
            outcome = "api_error"
            log.warning("reconcile of %s %s/%s: API error %s %s; retrying", kind, namespace, name, exc.status, exc.reason)
        except Exception:  # a bug: one object's failure must not stop the others; the resync retries it
            outcome = "error"
            log.exception("reconcile of %s %s/%s failed", kind, namespace, name)
        self.metrics.reconciles.labels(kind=kind, outcome=outcome).inc()
        self.metrics.duration.labels(kind=kind).observe(time.monotonic() - started)
        with self._mu:
            if key in self._dirty and not self._stop.is_set() and self._executor is not None and self._leading.is_set():
                self._dirty.discard(key)
                self._executor.submit(self._run, key)  # still running (no overlap), queued behind the others
                return
            self._dirty.discard(key)
            self._running.discard(key)

    def _resync_loop(self) -> None:
        while not self._stop.wait(self.options.resync_seconds):
            with self._mu:
                keys = sorted(self.known)
            for key in keys:
                self.trigger(key)
