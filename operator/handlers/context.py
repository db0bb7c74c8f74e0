"""What the handlers share: options, the API client, which runs and pools exist, their usage and progress, and
the reconcile queue (operator/control/queue.py) that runs them.

With leader election (operator/control/leader.py) every replica watches, and only the one holding the Lease
reconciles: triggers on the others are dropped, and the replica that becomes leader reconciles everything it
knows at once.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable

import kubernetes.client
from harnessrl.operator.api.enginepool import KIND as ENGINE_POOL_KIND
from harnessrl.operator.api.trainingrun import KIND as RUN_KIND
from harnessrl.operator.control.apply import Kube, path
from harnessrl.operator.control.backoff import Backoff
from harnessrl.operator.control.cache import ChildCache, KindKey, OnChange
from harnessrl.operator.control.leader import Elector, LeaderElection, default_namespace
from harnessrl.operator.control.queue import Key, ReconcileQueue
from harnessrl.operator.handlers.metrics import OperatorMetrics, PoolUsages, Usages
from harnessrl.operator.plan.types import Images
from harnessrl.runtime.contracts.coordinator import CoordinatorStatus
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("harnessrl.operator")


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


class Context:
    def __init__(self, options: OperatorOptions, api: kubernetes.client.ApiClient) -> None:
        self.options = options
        self.kube = Kube(api, timeout=options.request_timeout_s)
        self.refusals = Backoff(options.resync_seconds)
        self.progress: dict[tuple[str, str], CoordinatorStatus] = {}  # (namespace, run) -> last learner status
        self.usage: Usages = {}  # (namespace, run) -> its status.usage as last written
        self.pool_usage: PoolUsages = {}  # (namespace, EnginePool) -> the same
        self._pool_users: dict[tuple[str, str], set[str]] = {}  # (namespace, pool) -> active runs using it
        self._reconcilers: dict[str, Callable[[Context, str, str], None]] = {}
        self._mu = threading.Lock()
        self.metrics = OperatorMetrics()
        self.queue = ReconcileQueue(self._reconcile, options.workers, options.resync_seconds, self._observe)
        self.metrics.observe_queue(self.queue.depth)
        self.metrics.observe_usage(lambda: dict(self.usage), lambda: dict(self.pool_usage))
        for kind in ("TrainingRun", "HarnessPool"):
            self.metrics.observe_known(kind, functools.partial(self.queue.count, kind))
        election = options.leader_election
        self._elector = Elector(self.kube, election, self._lead, self._follow) if election else None

    @property
    def known(self) -> set[Key]:
        return self.queue.known

    def register(self, kind: str, reconcile: Callable[[Context, str, str], None]) -> None:
        self._reconcilers[kind] = reconcile

    def cache_children(self, kinds: list[KindKey], label_selector: str, on_change: OnChange) -> None:
        """Read these kinds (the objects with `label_selector`) from a watched cache from `start` on."""
        scopes: list[str | None] = [*self.options.namespaces] or [None]
        self.kube.cache = ChildCache(self.kube, {k: {ns: path(*k, ns) for ns in scopes} for k in kinds},
                                     label_selector, on_change)

    # -- lifecycle (kopf startup / cleanup) ---------------------------------------------------------
    def start(self) -> None:
        if self.kube.cache is not None:
            self.kube.cache.start()
            if not self.kube.cache.wait_synced(self.options.request_timeout_s):
                log.warning("some children are not listed yet; reconciles read those from the API server meanwhile")
        self.queue.start()
        if self._elector is None:
            self._lead()
        else:
            self._elector.start()

    def stop(self) -> None:
        if self.kube.cache is not None:
            self.kube.cache.stop()
        if self._elector is not None:
            self._elector.stop()
        self.queue.stop()

    def _lead(self) -> None:
        self.metrics.leader.set(1)
        self.queue.lead()

    def _follow(self) -> None:
        self.queue.follow()
        self.metrics.leader.set(0)

    def _reconcile(self, key: Key) -> None:
        kind, namespace, name = key
        self._reconcilers[kind](self, namespace, name)

    def _observe(self, kind: str, outcome: str, seconds: float) -> None:
        self.metrics.reconciles.labels(kind=kind, outcome=outcome).inc()
        self.metrics.duration.labels(kind=kind).observe(seconds)

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

    # -- triggers ---------------------------------------------------------------------------------------
    def seen(self, kind: str, namespace: str, name: str, *, deleted: bool = False) -> None:
        if deleted:
            if kind == RUN_KIND:  # a HarnessPool or EnginePool may have a run's name
                self.progress.pop((namespace, name), None)
                self.usage.pop((namespace, name), None)
            elif kind == ENGINE_POOL_KIND:
                self.pool_usage.pop((namespace, name), None)
            self.kube.forget(kind, namespace, name)
        self.queue.seen((kind, namespace, name), deleted=deleted)

    def trigger(self, key: Key) -> None:
        self.queue.trigger(key)

    def trigger_namespace(self, kind: str, namespace: str) -> None:
        self.queue.trigger_namespace(kind, namespace)

    def busy(self) -> bool:
        """Some reconcile is running or queued."""
        return self.queue.busy()
