"""Whole-run admission through Kueue: keep the run's Workload, and say what of the run may run now.

Read the Workload → create or replace it → the plan to apply (placed on the admitted flavors, or every Pod
stopped) → after the children are applied, give back the quota of an evicted Workload once the run's Pods are
gone, and mark it Finished when the run ends. The rules are in kube/kueue.py.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import NamedTuple

from harnessrl.operator.api import reasons as R
from harnessrl.operator.api.common import COMPONENT_LABEL
from harnessrl.operator.handlers.apply import ChildConflict, ChildRefused, Kube, holder
from harnessrl.operator.handlers.status import Observed, QueueState
from harnessrl.operator.kube import Manifest, Owner, kueue, render
from harnessrl.operator.plan import ComponentKind, Plan, stopped
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("harnessrl.operator.admission")
WORKLOAD_KINDS = {"Job", "JobSet", "StatefulSet", "Deployment"}
FINISHED_PHASES = {"Succeeded", "Failed"}


class Gate(NamedTuple):
    plan: Plan  # what to apply now
    queue: QueueState
    workload: Manifest | None  # as last read or written
    release: bool  # the Workload holds quota it must give back once the run's Pods are gone


def gate(kube: Kube, plan: Plan, owner: Owner) -> Gate:
    """The run's Workload converged on the plan, and the plan the run may apply now."""
    running = plan.model_copy(update={"suspended": False})  # the pod sets ask for what the run needs to run
    rendered = {m["metadata"]["name"]: m for m in render(running, owner) if m["kind"] in WORKLOAD_KINDS}
    desired = kueue.workload(plan, owner, kueue.pod_sets(running, rendered))
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
            if exc.status in (400, 403, 422):
                raise ChildRefused("Workload", name, exc) from None
            if exc.status != 409:  # 409: the replaced one is still going (a finalizer); the next pass creates it
                raise
        return Gate(stopped(plan), waiting, live, release=False)
    if not kueue.is_stale(live, desired):
        kube.ensure(desired, {(kueue.WORKLOAD_API, "Workload", name): live})  # spec.active follows spec.suspend
    evicted = kueue.condition(live, "Evicted")
    leaving = evicted is not None or kueue.is_stale(live, desired) or not desired["spec"]["active"]
    if kueue.holds_quota(live) and leaving:
        why = f"{evicted.get('reason')}: {evicted.get('message')}" if evicted else "its pod sets changed or it was deactivated"
        message = f"Kueue evicted Workload {name} ({why}); the run's Pods stop, then its quota is given back"
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


def pods_gone(observed: Observed) -> bool:
    """No Pod of the Workload's pod sets still runs (sandbox Pods are the runners' business, not in a pod set)."""
    sets = {str(k) for k in (ComponentKind.LEARNER, ComponentKind.ENGINE, ComponentKind.PROXY, ComponentKind.RUNNER)}
    return not any((p.get("status") or {}).get("phase") not in FINISHED_PHASES for p in observed.pods
                   if (p["metadata"].get("labels") or {}).get(COMPONENT_LABEL) in sets)


def release(kube: Kube, gate: Gate, observed: Observed) -> None:
    """Give back an evicted Workload's quota once the run's Pods are gone, so that Kueue can admit others."""
    if gate.release and gate.workload is not None and pods_gone(observed):
        meta = gate.workload["metadata"]
        log.info("Workload %s/%s: the run's Pods are gone; giving its quota back", meta["namespace"], meta["name"])
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
