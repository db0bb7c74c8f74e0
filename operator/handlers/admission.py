"""Admission through Kueue of a whole run, or of an EnginePool's servers: keep its Workload, and say what of it
may run now.

Read the Workload → create or replace it → the plan to apply (placed on the admitted flavors, or every Pod
stopped) → after the children are applied, give back the quota of an evicted Workload once its Pods are gone,
and mark a run's Workload Finished when the run ends. The rules are in kube/kueue.py.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Generic, NamedTuple

from harnessrl.operator.api import reasons as R
from harnessrl.operator.api.common import COMPONENT_LABEL
from harnessrl.operator.control.apply import (
    ChildConflict,
    ChildRefused,
    Kube,
    ensure_child,
    holder,
    refused_as_is,
)
from harnessrl.operator.handlers.status import QueueState
from harnessrl.operator.kube import Manifest, Owner, kueue
from harnessrl.operator.plan import stopped
from harnessrl.operator.plan.types import Admissible, ComponentKind
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("harnessrl.operator.admission")
FINISHED_PHASES = {"Succeeded", "Failed"}
# The Pods of a Workload's pod sets (sandbox Pods are the runners' business, not in a pod set).
POD_SET_COMPONENTS = {str(k) for k in (ComponentKind.LEARNER, ComponentKind.ENGINE, ComponentKind.PROXY,
                                       ComponentKind.RUNNER, ComponentKind.ENGINE_POOL)}


class Gate(NamedTuple, Generic[Admissible]):
    plan: Admissible  # what to apply now
    queue: QueueState
    workload: Manifest | None  # as last read or written
    release: bool  # the Workload holds quota it must give back once its Pods are gone


def kueue_missing(kube: Kube, queue: str | None, what: str) -> str | None:
    """Why `what` cannot be queued on `queue` here (Kueue's API is not served); None when it can, or is not queued."""
    if queue is None or kube.serves(kueue.WORKLOAD_GROUP_VERSION):
        return None
    return (f"spec.queueName {queue} admits {what} through Kueue, and this cluster does not serve "
            f"{kueue.WORKLOAD_API}: install Kueue or remove spec.queueName")


def gate(kube: Kube, plan: Admissible, owner: Owner, render: kueue.Render[Admissible]) -> Gate[Admissible]:
    """The Workload converged on the plan (a run's, or an EnginePool's rendered by `render`), and the plan to
    apply now."""
    desired = kueue.desired_workload(plan, owner, render)
    name, queue = desired["metadata"]["name"], desired["spec"]["queueName"]
    live = kube.get(kueue.WORKLOAD_API, "Workload", plan.namespace, name)
    if live is not None and (other := holder(desired, live)) is not None:
        raise ChildConflict("Workload", name, other)
    waiting = QueueState(admitted=False, reason=R.AWAITING_ADMISSION,
                         message=f"Workload {name} waits for Kueue to admit it from LocalQueue {queue}")
    if live is not None and kueue.is_stale(live, desired) and not kueue.holds_quota(live):
        log.info("replacing Workload %s/%s: its pod sets or queue changed", plan.namespace, name)
        kube.delete(kueue.WORKLOAD_API, "Workload", plan.namespace, name)
        live = None
    if live is None:
        try:
            live = kube.create(desired)
        except ApiException as exc:
            if refused_as_is(exc):
                raise ChildRefused("Workload", name, exc) from None
            if exc.status != 409:  # 409: the replaced one is still going (a finalizer); the next pass creates it
                raise
        return Gate(stopped(plan), waiting, live, release=False)
    if not kueue.is_stale(live, desired):
        ensure_child(kube, desired, {(kueue.WORKLOAD_API, "Workload", name): live})  # spec.active follows spec.suspend
    evicted = kueue.condition(live, "Evicted")
    leaving = evicted is not None or kueue.is_stale(live, desired) or not desired["spec"]["active"]
    if kueue.holds_quota(live) and leaving:
        why = f"{evicted.get('reason')}: {evicted.get('message')}" if evicted else "its pod sets changed or it was deactivated"
        message = f"Kueue evicted Workload {name} ({why}); its Pods stop, then its quota is given back"
        return Gate(stopped(plan), QueueState(admitted=False, reason=R.EVICTED_BY_KUEUE, message=message), live,
                    release=True)
    if kueue.is_admitted(live):
        flavors = kueue.assigned_flavors(live)
        specs = {f: (kube.get(kueue.FLAVOR_API, "ResourceFlavor", "", f) or {}).get("spec") or {}
                 for f in sorted({f for names in flavors.values() for f in names})}
        cluster_queue = live["status"]["admission"].get("clusterQueue")
        admitted = QueueState(admitted=True, message=f"Workload {name} admitted by ClusterQueue {cluster_queue}")
        return Gate(kueue.place(plan, flavors, specs), admitted, live, release=False)
    if evicted is not None:
        waiting = waiting.model_copy(update={
            "reason": R.EVICTED_BY_KUEUE,
            "message": f"Kueue evicted Workload {name} ({evicted.get('reason')}: {evicted.get('message')}); it waits "
                       f"to be admitted again from LocalQueue {queue}",
        })
    return Gate(stopped(plan), waiting, live, release=False)


def pods_gone(pods: list[Manifest]) -> bool:
    """No Pod of the Workload's pod sets among the owner's `pods` still runs."""
    return not any((p.get("status") or {}).get("phase") not in FINISHED_PHASES for p in pods
                   if (p["metadata"].get("labels") or {}).get(COMPONENT_LABEL) in POD_SET_COMPONENTS)


def release(kube: Kube, gate: Gate[Admissible], pods: list[Manifest]) -> None:
    """Give back an evicted Workload's quota once its Pods (of the owner's `pods`) are gone, so that Kueue can admit
    others."""
    if gate.release and gate.workload is not None and pods_gone(pods):
        meta = gate.workload["metadata"]
        log.info("Workload %s/%s: its Pods are gone; giving its quota back", meta["namespace"], meta["name"])
        kube.patch_status(kueue.WORKLOAD_API, "Workload", meta["namespace"], meta["name"],
                          kueue.release_status(gate.workload, now()))


def finish(kube: Kube, namespace: str, run: str, succeeded: bool, message: str) -> None:
    """Mark the run's Workload Finished (once): Kueue releases its quota."""
    live = kube.get(kueue.WORKLOAD_API, "Workload", namespace, kueue.workload_name(run))
    if live is not None and kueue.condition(live, "Finished") is None:
        kube.patch_status(kueue.WORKLOAD_API, "Workload", namespace, live["metadata"]["name"],
                          kueue.finished_status(live, succeeded, message, now()))


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
