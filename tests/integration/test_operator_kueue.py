"""Admission through Kueue of a whole run, and of an EnginePool's servers: the operator (kopf over HTTP) against
the API emulator with Kueue's Workload and ResourceFlavor CRDs applied (tests/fixtures/crds). Kueue itself does not run here: each test plays
its part, writing the Workload's status as Kueue's scheduler does (quota reserved and admitted with flavors,
evicted on preemption), and checks what the operator does with each answer.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.test_operator_enginepool import EP, engine_pool, on_pool, pool_status
from tests.integration.test_operator_reconcile import (  # noqa: F401 (fixtures)
    MINI_REPLICAS,
    NS,
    ROOT,
    TR,
    apply_pools,
    cluster,
    learner_status,
    make_pod,
    operator,
    reconciled_after_a_spec_change,
    small_run,
    wait_condition,
)

pytestmark = pytest.mark.timeout(90)
WL = ("kueue.x-k8s.io/v1beta1", "Workload")
CRDS = ROOT / "tests" / "fixtures" / "crds"
T0 = "2026-01-01T00:00:00Z"
GPU_TOLERATION = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def kueue(operator: Any) -> Any:  # noqa: F811 (the imported fixture)
    for crd in ("workloads.kueue.x-k8s.io.yaml", "resourceflavors.kueue.x-k8s.io.yaml"):
        operator.apply(CRDS / crd)
    operator.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "h100"},
                    "spec": {"nodeLabels": {"gpu": "h100"}, "tolerations": [GPU_TOLERATION]}})
    operator.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "cpu"},
                    "spec": {"nodeLabels": {"pool": "cpu"}}})
    apply_pools(operator, "mini-swe-agent")
    return operator


def cond(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": T0}


def admit(kube: Any, run: str) -> None:
    """What Kueue's scheduler writes when the ClusterQueue has quota: an admission with a flavor per pod set."""
    wl = kube.get(*WL, run, namespace=NS)
    assignments = [{"name": s["name"], "count": s["count"],
                    "flavors": {"nvidia.com/gpu" if s["name"] in ("learner", "engine") else "cpu":
                                "h100" if s["name"] in ("learner", "engine") else "cpu"}}
                   for s in wl["spec"]["podSets"]]
    kube.patch(*WL, run, {"status": {
        "admission": {"clusterQueue": "gpu-cq", "podSetAssignments": assignments},
        "conditions": [cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue gpu-cq"),
                       cond("Admitted", "True", "Admitted", "The workload is admitted")],
    }}, namespace=NS, subresource="status")


def evict(kube: Any, run: str) -> None:
    wl = kube.get(*WL, run, namespace=NS)
    conditions = [*wl["status"]["conditions"], cond("Evicted", "True", "Preempted", "Preempted to accommodate a higher priority Workload")]
    kube.patch(*WL, run, {"status": {"conditions": conditions}}, namespace=NS, subresource="status")


def sts(kube: Any, name: str) -> dict[str, Any]:
    return kube.get("apps/v1", "StatefulSet", name, namespace=NS)


def job(kube: Any, run: str) -> dict[str, Any]:
    return kube.get("batch/v1", "Job", f"{run}-learner", namespace=NS)


def stopped(kube: Any, run: str) -> bool:
    workloads = [sts(kube, f"{run}-engine"), sts(kube, f"{run}-proxy"),
                 kube.get("apps/v1", "Deployment", f"{run}-mini-swe-agent-runner", namespace=NS)]
    learner = job(kube, run)
    return all(w is not None and w["spec"]["replicas"] == 0 for w in workloads) and learner is not None and learner["spec"]["suspend"]


def running(kube: Any, run: str) -> bool:
    engine = sts(kube, f"{run}-engine")
    return engine is not None and engine["spec"]["replicas"] == 1 and job(kube, run)["spec"]["suspend"] is False


def test_a_queued_run_holds_nothing_until_kueue_admits_its_workload(kueue: Any) -> None:
    kueue.apply(small_run(queueName="team-a"))
    wl = kueue.wait_for(lambda: kueue.get(*WL, "run-a", namespace=NS), timeout=15)
    run = kueue.get(*TR, "run-a", namespace=NS)
    assert wl["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"]
    assert wl["spec"]["queueName"] == "team-a" and wl["spec"]["active"] is True
    sets = {s["name"]: s for s in wl["spec"]["podSets"]}
    assert {n: s["count"] for n, s in sets.items()} == {"learner": 1, "engine": 1, "proxy": 1, "runner-0": MINI_REPLICAS}
    assert sets["engine"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # Every child exists, none runs a Pod; none carries Kueue's queue label (Kueue would admit it on its own).
    kueue.wait_for(lambda: stopped(kueue, "run-a"), timeout=15)
    for kind in ("StatefulSet", "Deployment", "Job"):
        api = "batch/v1" if kind == "Job" else "apps/v1"
        for child in kueue.list_objects(api, kind, NS, label_selector="harnessrl.io/run=run-a"):
            assert "kueue.x-k8s.io/queue-name" not in child["metadata"].get("labels", {})
    ready = wait_condition(kueue, "run-a", "Ready", "False", "AwaitingAdmission")
    assert "LocalQueue team-a" in ready["message"]
    assert kueue.get(*TR, "run-a", namespace=NS)["status"]["phase"] == "Pending"

    admit(kueue, "run-a")
    kueue.wait_for(lambda: running(kueue, "run-a"), timeout=15)
    engine = sts(kueue, "run-a-engine")["spec"]["template"]["spec"]
    assert engine["nodeSelector"]["gpu"] == "h100" and GPU_TOLERATION in engine["tolerations"]
    # The learner's Job, suspended until now, was moved to its flavor's nodes as it was started.
    learner = job(kueue, "run-a")["spec"]["template"]["spec"]
    assert learner["nodeSelector"]["gpu"] == "h100" and GPU_TOLERATION in learner["tolerations"]
    proxy = sts(kueue, "run-a-proxy")
    assert proxy["spec"]["replicas"] == 1 and proxy["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    runner = kueue.get("apps/v1", "Deployment", "run-a-mini-swe-agent-runner", namespace=NS)
    assert runner["spec"]["replicas"] == MINI_REPLICAS
    wait_condition(kueue, "run-a", "Ready", "False", "ReplicasNotReady")  # admitted: now the Pods' own progress


def test_eviction_stops_the_run_then_gives_the_quota_back(kueue: Any) -> None:
    kueue.apply(small_run(queueName="team-a"))
    kueue.wait_for(lambda: kueue.get(*WL, "run-a", namespace=NS), timeout=15)
    admit(kueue, "run-a")
    kueue.wait_for(lambda: running(kueue, "run-a"), timeout=15)
    make_pod(kueue, "run-a", "learner", "run-a-learner-x", {"phase": "Running"})

    evict(kueue, "run-a")
    kueue.wait_for(lambda: stopped(kueue, "run-a"), timeout=15)
    ready = wait_condition(kueue, "run-a", "Ready", "False", "EvictedByKueue")
    # Suspended, the Job's controller resets its startTime: the flavor's nodes are given back from its template.
    kueue.wait_for(lambda: "gpu" not in (job(kueue, "run-a")["spec"]["template"]["spec"].get("nodeSelector") or {}),
                   timeout=15)
    assert "Preempted" in ready["message"]
    # A learner Pod still runs: the quota stays held until it is gone (no other run lands on its GPUs).
    reconciled_after_a_spec_change(kueue, "run-a")
    assert kueue.get(*WL, "run-a", namespace=NS)["status"].get("admission")

    kueue.delete("v1", "Pod", "run-a-learner-x", NS)
    kueue.patch("batch/v1", "Job", "run-a-learner", {"status": {"active": 0}}, namespace=NS, subresource="status")
    released = kueue.wait_for(lambda: (w := kueue.get(*WL, "run-a", namespace=NS)) and not w["status"].get("admission") and w,
                              timeout=15)
    by_type = {c["type"]: c for c in released["status"]["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False" and by_type["QuotaReserved"]["reason"] == "Pending"
    assert by_type["Admitted"]["status"] == "False"
    wait_condition(kueue, "run-a", "Ready", "False", "EvictedByKueue")  # waits to be admitted again

    # Kueue admits it again (the Evicted condition goes): the run resumes.
    kueue.patch(*WL, "run-a", {"status": {"conditions": []}}, namespace=NS, subresource="status")
    admit(kueue, "run-a")
    kueue.wait_for(lambda: running(kueue, "run-a"), timeout=15)


def test_suspend_deactivates_the_workload_and_a_finished_run_releases_it(kueue: Any) -> None:
    kueue.apply(small_run(queueName="team-a"))
    kueue.wait_for(lambda: kueue.get(*WL, "run-a", namespace=NS), timeout=15)
    admit(kueue, "run-a")
    kueue.wait_for(lambda: running(kueue, "run-a"), timeout=15)

    kueue.patch(*TR, "run-a", {"spec": {"suspend": True}}, namespace=NS)
    kueue.wait_for(lambda: kueue.get(*WL, "run-a", namespace=NS)["spec"]["active"] is False, timeout=15)
    kueue.wait_for(lambda: stopped(kueue, "run-a"), timeout=15)
    # What Kueue does with an inactive Workload: evicts it; the operator gives the quota back (no Pods left).
    evict(kueue, "run-a")
    kueue.wait_for(lambda: not kueue.get(*WL, "run-a", namespace=NS)["status"].get("admission"), timeout=15)
    wait_condition(kueue, "run-a", "Suspended", "True", "SuspendedByUser")

    kueue.patch(*TR, "run-a", {"spec": {"suspend": False}}, namespace=NS)
    kueue.wait_for(lambda: kueue.get(*WL, "run-a", namespace=NS)["spec"]["active"] is True, timeout=15)
    kueue.patch(*WL, "run-a", {"status": {"conditions": []}}, namespace=NS, subresource="status")
    admit(kueue, "run-a")
    kueue.wait_for(lambda: running(kueue, "run-a"), timeout=15)

    kueue.patch("batch/v1", "Job", "run-a-learner", {"status": {"succeeded": 1, "conditions": [
        {"type": "Complete", "status": "True", "lastTransitionTime": T0}]}}, namespace=NS, subresource="status")
    wait_condition(kueue, "run-a", "Complete", "True")
    finished = kueue.wait_for(lambda: next((c for c in kueue.get(*WL, "run-a", namespace=NS)["status"]["conditions"]
                                            if c["type"] == "Finished"), None), timeout=15)
    assert finished["status"] == "True" and finished["reason"] == "Succeeded"


def test_a_change_to_what_quota_counts_requeues_the_run_once_it_stopped(kueue: Any) -> None:
    kueue.apply(small_run(queueName="team-a"))
    first = kueue.wait_for(lambda: kueue.get(*WL, "run-a", namespace=NS), timeout=15)
    admit(kueue, "run-a")
    kueue.wait_for(lambda: running(kueue, "run-a"), timeout=15)
    # A config change (steps) is not a quota change: the Workload stays, admitted.
    kueue.patch(*TR, "run-a", {"spec": {"grpo": {"steps": 7}}}, namespace=NS)
    reconciled_after_a_spec_change(kueue, "run-a")
    assert kueue.get(*WL, "run-a", namespace=NS)["metadata"]["uid"] == first["metadata"]["uid"]
    assert running(kueue, "run-a")

    kueue.patch(*TR, "run-a", {"spec": {"engine": {"gpus": 2}}}, namespace=NS)
    # Stopped, quota given back (no Pods), the old Workload replaced by one asking for 2 GPUs per engine.
    second = kueue.wait_for(lambda: (w := kueue.get(*WL, "run-a", namespace=NS)) and w["metadata"]["uid"] != first["metadata"]["uid"] and w,
                            timeout=20)
    engine = next(s for s in second["spec"]["podSets"] if s["name"] == "engine")
    assert engine["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert stopped(kueue, "run-a")
    wait_condition(kueue, "run-a", "Ready", "False", "AwaitingAdmission")


def test_a_queued_run_without_kueue_installed_says_so(operator: Any) -> None:  # noqa: F811
    apply_pools(operator, "mini-swe-agent")
    operator.apply(small_run(queueName="team-a"))
    ready = wait_condition(operator, "run-a", "Ready", "False", "KueueNotInstalled")
    assert "kueue.x-k8s.io/v1beta1" in ready["message"]
    assert operator.get("apps/v1", "StatefulSet", "run-a-engine", namespace=NS) is None


SERVERS = "shared-enginepool"  # the StatefulSet of EnginePool `shared`


def pool_ready(kube: Any, reason: str) -> dict[str, Any]:
    """The pool's Ready condition, once it is False with `reason`."""
    return kube.wait_for(lambda: next((c for c in pool_status(kube).get("conditions") or []
                                       if c["type"] == "Ready" and c["status"] == "False" and c["reason"] == reason),
                                      None), timeout=15)


def servers_at(kube: Any, replicas: int) -> dict[str, Any]:
    return kube.wait_for(lambda: (s := sts(kube, SERVERS)) and s["spec"]["replicas"] == replicas and s, timeout=15)


def admitted_pool(kube: Any) -> dict[str, Any]:
    """A queued pool (one server) that Kueue admitted; returns its Workload as first created."""
    kube.apply(engine_pool(queueName="team-a"))
    first: dict[str, Any] = kube.wait_for(lambda: kube.get(*WL, "shared", namespace=NS), timeout=15)
    admit(kube, "shared")
    servers_at(kube, 1)
    return first


def test_a_queued_pool_runs_no_server_until_kueue_admits_it_then_on_its_flavors_nodes(kueue: Any) -> None:
    kueue.apply(engine_pool(queueName="team-a"))
    wl = kueue.wait_for(lambda: kueue.get(*WL, "shared", namespace=NS), timeout=15)
    pool = kueue.get(*EP, "shared", namespace=NS)
    owner = wl["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("EnginePool", pool["metadata"]["uid"], True)
    assert wl["spec"]["queueName"] == "team-a"
    [engine] = wl["spec"]["podSets"]
    assert engine["name"] == "engine" and engine["count"] == 1
    assert engine["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # The servers exist with no Pod; the pool, and a run on it, say why.
    assert "kueue.x-k8s.io/queue-name" not in servers_at(kueue, 0)["metadata"].get("labels", {})
    assert "LocalQueue team-a" in pool_ready(kueue, "AwaitingAdmission")["message"]
    assert pool_status(kueue)["phase"] == "Pending"
    kueue.apply(on_pool("run-a"))
    engine_ready = wait_condition(kueue, "run-a", "EngineReady", "False", "AwaitingAdmission")
    assert engine_ready["message"].startswith("EnginePool shared awaits Kueue's admission")

    admit(kueue, "shared")
    servers = servers_at(kueue, 1)["spec"]["template"]["spec"]
    assert servers["nodeSelector"]["gpu"] == "h100" and GPU_TOLERATION in servers["tolerations"]
    pool_ready(kueue, "ReplicasNotReady")  # admitted: now the servers' own progress
    wait_condition(kueue, "run-a", "EngineReady", "False", "ReplicasNotReady")


def test_eviction_stops_the_pools_servers_then_gives_the_quota_back(kueue: Any) -> None:
    admitted_pool(kueue)
    labels = sts(kueue, SERVERS)["spec"]["template"]["metadata"]["labels"]  # as the StatefulSet controller copies them
    kueue.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{SERVERS}-0", "namespace": NS, "labels": labels},
                 "spec": {"containers": [{"name": "vllm", "image": "x"}]}})
    kueue.patch("v1", "Pod", f"{SERVERS}-0", {"status": {"phase": "Running"}}, namespace=NS, subresource="status")

    evict(kueue, "shared")
    servers_at(kueue, 0)
    assert "Preempted" in pool_ready(kueue, "EvictedByKueue")["message"]
    # A server Pod still runs: the quota stays held until it is gone. (A config change proves a later reconcile.)
    generation = kueue.patch(*EP, "shared", {"spec": {"lora": {"maxLoras": 9}}}, namespace=NS)["metadata"]["generation"]
    kueue.wait_for(lambda: pool_status(kueue).get("observedGeneration") == generation, timeout=15)
    assert kueue.get(*WL, "shared", namespace=NS)["status"].get("admission")

    kueue.delete("v1", "Pod", f"{SERVERS}-0", NS)
    released = kueue.wait_for(lambda: (w := kueue.get(*WL, "shared", namespace=NS)) and not w["status"].get("admission")
                              and w, timeout=15)
    by_type = {c["type"]: c for c in released["status"]["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False" and by_type["Admitted"]["status"] == "False"
    pool_ready(kueue, "EvictedByKueue")  # waits to be admitted again

    kueue.patch(*WL, "shared", {"status": {"conditions": []}}, namespace=NS, subresource="status")
    admit(kueue, "shared")
    servers_at(kueue, 1)


def test_a_change_to_what_the_pools_quota_counts_requeues_it_once_stopped(kueue: Any) -> None:
    first = admitted_pool(kueue)
    kueue.patch(*EP, "shared", {"spec": {"engine": {"replicas": 2}}}, namespace=NS)
    second = kueue.wait_for(lambda: (w := kueue.get(*WL, "shared", namespace=NS))
                            and w["metadata"]["uid"] != first["metadata"]["uid"] and w, timeout=20)
    assert [s["count"] for s in second["spec"]["podSets"]] == [2]
    servers_at(kueue, 0)
    pool_ready(kueue, "AwaitingAdmission")


def test_a_queued_pool_without_kueue_installed_says_so(operator: Any) -> None:  # noqa: F811
    operator.apply(engine_pool(queueName="team-a"))
    assert "kueue.x-k8s.io/v1beta1" in pool_ready(operator, "KueueNotInstalled")["message"]
    assert sts(operator, SERVERS) is None
