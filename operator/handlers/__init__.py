"""kopf handlers: thin. Events only trigger level-based reconciles (see context.py); the reconcilers read,
plan, apply and write status (trainingrun.py, harnesspool.py, enginepool.py; status.py computes conditions)."""

from __future__ import annotations

from typing import Any

import kopf
import kubernetes.client
from harnessrl.operator.api.common import ENGINE_POOL_LABEL, GROUP, VERSION
from harnessrl.operator.api.enginepool import KIND as ENGINE_POOL_KIND
from harnessrl.operator.api.enginepool import PLURAL as ENGINE_POOL_PLURAL
from harnessrl.operator.api.harnesspool import KIND as POOL_KIND
from harnessrl.operator.api.harnesspool import PLURAL as POOL_PLURAL
from harnessrl.operator.api.trainingrun import KIND as RUN_KIND
from harnessrl.operator.api.trainingrun import PLURAL as RUN_PLURAL
from harnessrl.operator.handlers import enginepool, harnesspool, trainingrun
from harnessrl.operator.handlers.context import Context, OperatorOptions
from harnessrl.operator.handlers.trainingrun import CHILD_KINDS
from harnessrl.operator.kube.common import MANAGED_BY, MANAGED_BY_LABEL, RUN

__all__ = ["Context", "OperatorOptions", "build_registry"]

# The kinds of children the operator reads from its cache (control/cache.py): all a run has but its Secrets (read
# by name only: listing them would read every Secret) and the kinds that need a CRD (JobSet, Kueue's Workload).
CACHED_CHILDREN = [*CHILD_KINDS, ("v1", "Pod")]
# Children whose changes (status, deletion) are worth an immediate reconcile of their owner.
TRIGGERING_CHILDREN = {"StatefulSet", "Deployment", "Job"}


def build_registry(options: OperatorOptions, api: kubernetes.client.ApiClient) -> tuple[kopf.OperatorRegistry, Context]:
    """A kopf registry with the operator's handlers (no login handler: the caller adds the one it needs).

    No handler here needs a finalizer (no on.delete, no kopf timers or daemons): deletion never waits for
    the operator, and children are garbage-collected through their ownerReferences.
    """
    registry = kopf.OperatorRegistry()
    ctx = Context(options, api)
    ctx.register(RUN_KIND, trainingrun.reconcile)
    ctx.register(POOL_KIND, harnesspool.reconcile)
    ctx.register(ENGINE_POOL_KIND, enginepool.reconcile)

    def child_changed(kind: str, child: dict[str, Any]) -> None:
        if kind not in TRIGGERING_CHILDREN:
            return
        meta = child["metadata"]
        namespace, labels = meta.get("namespace") or "", meta.get("labels") or {}
        if run := labels.get(RUN):
            ctx.trigger((RUN_KIND, namespace, run))
            ctx.trigger_namespace(POOL_KIND, namespace)
        elif pool := labels.get(ENGINE_POOL_LABEL):  # an EnginePool's servers: its runs' EngineReady too
            ctx.trigger((ENGINE_POOL_KIND, namespace, pool))
            ctx.trigger_namespace(RUN_KIND, namespace)

    ctx.cache_children(CACHED_CHILDREN, f"{MANAGED_BY_LABEL}={MANAGED_BY}", child_changed)

    @kopf.on.startup(registry=registry)
    def start(**_: Any) -> None:
        ctx.start()

    @kopf.on.cleanup(registry=registry)
    def stop(**_: Any) -> None:
        ctx.stop()

    # The event of the operator's own status write is no news: reconciling again for it only kept the key busy
    # and (through a pool's status) every run of the namespace (benchmarks/operator).
    @kopf.on.event(GROUP, VERSION, RUN_PLURAL, registry=registry)
    def run_event(type: str | None, namespace: str, name: str, body: kopf.Body, **_: Any) -> None:
        # Which pools the run takes runners from (its own status write may end that): the others sharing a pool
        # resize their runners.
        pools = set() if type == "DELETED" else trainingrun.active_pools(dict(body))
        for other in ctx.use_pools(namespace, name, pools):
            ctx.trigger((RUN_KIND, namespace, other))
        if not ctx.kube.is_own_status_write(RUN_KIND, namespace, name, body.metadata.get("resourceVersion")):
            ctx.seen(RUN_KIND, namespace, name, deleted=type == "DELETED")
            ctx.trigger_namespace(ENGINE_POOL_KIND, namespace)  # their status lists the runs on them

    @kopf.on.event(GROUP, VERSION, POOL_PLURAL, registry=registry)
    def pool_event(type: str | None, namespace: str, name: str, body: kopf.Body, **_: Any) -> None:
        if not ctx.kube.is_own_status_write(POOL_KIND, namespace, name, body.metadata.get("resourceVersion")):
            ctx.seen(POOL_KIND, namespace, name, deleted=type == "DELETED")
            ctx.trigger_namespace(RUN_KIND, namespace)

    @kopf.on.event(GROUP, VERSION, ENGINE_POOL_PLURAL, registry=registry)
    def engine_pool_event(type: str | None, namespace: str, name: str, body: kopf.Body, **_: Any) -> None:
        if not ctx.kube.is_own_status_write(ENGINE_POOL_KIND, namespace, name, body.metadata.get("resourceVersion")):
            ctx.seen(ENGINE_POOL_KIND, namespace, name, deleted=type == "DELETED")
            ctx.trigger_namespace(RUN_KIND, namespace)  # the runs on it follow its servers (or its absence)

    # Kueue admits or evicts a run (optional CRD, so not in the cache: kopf watches it once it is served).
    @kopf.on.event("kueue.x-k8s.io", "v1beta1", "workloads", labels={MANAGED_BY_LABEL: MANAGED_BY}, registry=registry)
    def workload_event(namespace: str, labels: dict[str, str], **_: Any) -> None:
        if run := labels.get(RUN):
            ctx.trigger((RUN_KIND, namespace, run))

    return registry, ctx
