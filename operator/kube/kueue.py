"""A run (or an EnginePool's servers) as one Kueue Workload, and what Kueue's answer means for it. Pure.

Kueue admits custom jobs through their own controller ("external frameworks"): the controller creates a
Workload owned by the job, with one pod set per group of identical Pods (a run's components; a pool's servers);
Kueue reserves quota and marks it Admitted; the controller starts the Pods with the admitted flavors' node
labels and tolerations; when Kueue evicts the Workload (preemption, `spec.active: false`), the controller stops
the Pods and then gives the quota back (clears `status.admission`); when the job ends, it marks the Workload
Finished.

The pod sets carry only what quota and flavor assignment read (counts, requests, nodeSelector, tolerations,
affinity, priority class), so a config change does not re-queue a run or pool; a change there does (pod sets
are immutable: the Workload is replaced once its Pods have stopped).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from harnessrl.operator.api.common import Toleration
from harnessrl.operator.kube.common import Manifest, Owner, metadata
from harnessrl.operator.plan.types import Admissible, Component, ComponentKind, EnginePoolPlan, Plan

WORKLOAD_API = "kueue.x-k8s.io/v1beta1"
WORKLOAD_GROUP_VERSION = "/apis/kueue.x-k8s.io/v1beta1"
FLAVOR_API = WORKLOAD_API
POD_SETS_DIGEST = "harnessrl.io/pod-sets-digest"
# The pod template fields Kueue's quota and flavor assignment read.
SCHEDULING_FIELDS = ("nodeSelector", "tolerations", "affinity", "priorityClassName", "runtimeClassName", "overhead")
CONTAINER_FIELDS = ("name", "image", "resources")
WORKLOAD_KINDS = {"Job", "JobSet", "StatefulSet", "Deployment"}
Render = Callable[[Admissible, Owner], list[Manifest]]


def workload_name(owner: str) -> str:
    return owner  # one Workload per run or pool, named as it (kubectl get workloads shows the owner's name)


def pod_set_components(plan: Plan | EnginePoolPlan) -> list[tuple[str, Component]]:
    """(pod set name, component) for every component with Pods. Runners are numbered: pool names may be longer
    than a pod set name allows; their template's pool label says which pool each is."""
    if isinstance(plan, EnginePoolPlan):
        return [("engine", plan.engine)]
    # A run on an EnginePool has no engine of its own: the pool's servers are not the run's to queue.
    named = [("learner", plan.learner), *([("engine", plan.engine)] if plan.engine else []), ("proxy", plan.proxy)]
    return named + [(f"runner-{i}", c) for i, c in enumerate(plan.runners)]


def pod_template(workload: Manifest) -> Manifest:
    """The Pod template of a rendered Job, JobSet, StatefulSet or Deployment."""
    spec = workload["spec"]
    if workload["kind"] == "JobSet":
        spec = spec["replicatedJobs"][0]["template"]["spec"]
    template: Manifest = spec["template"]
    return template


def pod_count(workload: Manifest) -> int:
    spec = workload["spec"]
    if workload["kind"] == "JobSet":
        job = spec["replicatedJobs"][0]
        return int(job["replicas"]) * int(job["template"]["spec"]["parallelism"])
    return int(spec["parallelism"] if workload["kind"] == "Job" else spec["replicas"])


def quota_template(template: Manifest) -> Manifest:
    """What Kueue reads of a Pod template: its labels, its containers' requests, where it may run."""
    spec = template["spec"]

    def containers(key: str) -> list[Manifest]:
        return [{k: c[k] for k in CONTAINER_FIELDS if k in c} for c in spec.get(key) or []]

    reduced: Manifest = {"containers": containers("containers")}
    if spec.get("initContainers"):
        reduced["initContainers"] = containers("initContainers")
    reduced |= {k: spec[k] for k in SCHEDULING_FIELDS if k in spec}
    return {"metadata": {"labels": dict(template["metadata"].get("labels") or {})}, "spec": reduced}


def pod_sets(plan: Plan | EnginePoolPlan, workloads: dict[str, Manifest]) -> list[Manifest]:
    """The Workload's pod sets from the rendered workloads (by child name) of the plan as it runs (not stopped)."""
    return [
        {"name": name, "count": pod_count(workloads[c.name]), "template": quota_template(pod_template(workloads[c.name]))}
        for name, c in pod_set_components(plan)
    ]


def desired_workload(plan: Admissible, owner: Owner, render: Render[Admissible]) -> Manifest:
    """The Workload of `plan` as built (suspended only by its spec): its pod sets ask for what it needs to run,
    read from its workloads as `render` gives them."""
    running = plan.model_copy(update={"suspended": False})
    rendered = {m["metadata"]["name"]: m for m in render(running, owner) if m["kind"] in WORKLOAD_KINDS}
    return workload(plan, owner, pod_sets(running, rendered))


def workload(plan: Plan | EnginePoolPlan, owner: Owner, sets: list[Manifest]) -> Manifest:
    assert plan.spec.queue_name is not None
    # The owner's labels: the operator's watch on Workloads triggers the run's (or pool's) reconcile by them.
    meta = metadata(plan, owner, workload_name(plan.scope_name),
                    ComponentKind.ENGINE_POOL if isinstance(plan, EnginePoolPlan) else "run")
    meta["annotations"] = {POD_SETS_DIGEST: digest(plan.spec.queue_name, sets)}
    return {
        "apiVersion": WORKLOAD_API,
        "kind": "Workload",
        "metadata": meta,
        "spec": {"queueName": plan.spec.queue_name, "active": not plan.suspended, "podSets": sets},
    }


def digest(queue: str, sets: list[Manifest]) -> str:
    return hashlib.sha256(json.dumps([queue, sets], sort_keys=True).encode()).hexdigest()[:16]


def is_stale(live: Manifest, desired: Manifest) -> bool:
    """The live Workload asks for other pod sets or another queue (both fixed once Kueue reserved quota)."""
    return bool((live["metadata"].get("annotations") or {}).get(POD_SETS_DIGEST) != desired["metadata"]["annotations"][POD_SETS_DIGEST])


def condition(live: Manifest, type_: str) -> Manifest | None:
    """The condition `type_` of a Workload when it is True."""
    return next((c for c in (live.get("status") or {}).get("conditions") or []
                 if c.get("type") == type_ and c.get("status") == "True"), None)


def holds_quota(live: Manifest) -> bool:
    return bool((live.get("status") or {}).get("admission"))


def is_admitted(live: Manifest) -> bool:
    return holds_quota(live) and condition(live, "Admitted") is not None


def assigned_flavors(live: Manifest) -> dict[str, list[str]]:
    """Pod set name -> the ResourceFlavors Kueue assigned to it (one per resource; usually one in all)."""
    admission = (live.get("status") or {}).get("admission") or {}
    return {a["name"]: sorted(set((a.get("flavors") or {}).values())) for a in admission.get("podSetAssignments") or []}


def place(plan: Admissible, flavors: dict[str, list[str]], flavor_specs: dict[str, Manifest]) -> Admissible:
    """The plan with each component's Pods pinned to its admitted flavors' nodes (their nodeLabels join the
    nodeSelector, their tolerations the Pod's), as Kueue's own integrations do on admission."""
    updates: dict[str, Any] = {}
    for name, component in pod_set_components(plan):
        specs = [flavor_specs.get(f) or {} for f in flavors.get(name, [])]
        node_labels: dict[str, str] = {}
        tolerations = list(component.pod.tolerations)
        for spec in specs:
            node_labels |= spec.get("nodeLabels") or {}
            tolerations += [Toleration.model_validate(t) for t in spec.get("tolerations") or []]
        pod = component.pod.model_copy(update={"node_selector": component.pod.node_selector | node_labels,
                                               "tolerations": tolerations})
        updates[name] = component.model_copy(update={"pod": pod})
    if isinstance(plan, EnginePoolPlan):
        return plan.model_copy(update={"engine": updates["engine"]})
    return plan.model_copy(update={
        # A run on an EnginePool has no engine (nor its pod set).
        "learner": updates["learner"], "engine": updates.get("engine"), "proxy": updates["proxy"],
        "runners": [updates[f"runner-{i}"] for i in range(len(plan.runners))],
    })


def set_condition(live: Manifest, type_: str, status: str, reason: str, message: str, now: str) -> list[Manifest]:
    """The Workload's conditions with `type_` set (its lastTransitionTime kept when the status stays)."""
    conditions = [dict(c) for c in (live.get("status") or {}).get("conditions") or []]
    old = next((c for c in conditions if c.get("type") == type_), None)
    new = {"type": type_, "status": status, "reason": reason, "message": message[:32768],
           "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status else now,
           "observedGeneration": int(live["metadata"].get("generation") or 0)}
    return [new if c is old else c for c in conditions] + ([] if old else [new])


def release_status(live: Manifest, now: str) -> Manifest:
    """The status that gives an evicted Workload's quota back once its Pods are gone (what Kueue's job
    framework writes after stopping a job): no admission, QuotaReserved and Admitted False."""
    conditions = {**live, "status": {**(live.get("status") or {}),
                                     "conditions": set_condition(live, "QuotaReserved", "False", "Pending",
                                                                 "its Pods are stopped", now)}}
    return {"admission": None,
            "conditions": set_condition(conditions, "Admitted", "False", "NoReservation",
                                        "the Workload has no quota reservation", now)}


def finished_status(live: Manifest, succeeded: bool, message: str, now: str) -> Manifest:
    """Finished True: Kueue releases the quota of a run that completed or failed."""
    reason = "Succeeded" if succeeded else "Failed"
    return {"conditions": set_condition(live, "Finished", "True", reason, message, now)}
