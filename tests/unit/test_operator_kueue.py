"""A run as one Kueue Workload (operator/kube/kueue.py): its pod sets, when it must be replaced, and the
placement Kueue's admission gives each component."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.kube import kueue, render
from harnessrl.operator.plan import build_plan, stopped
from harnessrl.operator.plan.placement import ClusterPlacement
from harnessrl.operator.plan.types import PlanError

from tests.unit.test_operator_manifests import EXAMPLE, K8S_VERSION, OWNER, POOLS, ROOT

WORKLOAD_CRD = yaml.safe_load((ROOT / "tests" / "fixtures" / "crds" / "workloads.kueue.x-k8s.io.yaml").read_text())


def plan_of(**changes: Any) -> Any:
    spec = TrainingRunSpec.model_validate(EXAMPLE["spec"] | changes)
    return build_plan("run", "team", spec, POOLS, ClusterPlacement("team"))


def workload_of(plan: Any) -> dict[str, Any]:
    """The Workload as handlers/admission.py builds it: pod sets from the running plan."""
    return kueue.desired_workload(plan, OWNER, render)


def test_the_example_run_is_one_workload_with_a_pod_set_per_component() -> None:
    plan = plan_of()
    workload = workload_of(plan)
    assert workload["spec"]["queueName"] == "team-a" and workload["spec"]["active"] is True
    assert workload["metadata"]["ownerReferences"] == [OWNER.reference()]
    sets = {s["name"]: s for s in workload["spec"]["podSets"]}
    pools = [c.pool for c in plan.runners]
    assert list(sets) == ["learner", "engine", "proxy", *[f"runner-{i}" for i in range(len(pools))]]
    assert [sets["engine"]["count"], sets["learner"]["count"]] == [plan.spec.engine.replicas, 1]
    assert [sets[f"runner-{i}"]["template"]["metadata"]["labels"]["harnessrl.io/pool"] for i in range(len(pools))] == pools
    engine = sets["engine"]["template"]["spec"]
    assert engine["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert engine["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert engine["priorityClassName"] == "training"
    assert set(engine["containers"][0]) == {"name", "image", "resources"}  # no command, env, probes: quota only
    # Every pod set template is a valid core/v1 PodTemplateSpec (the part the fixture CRD leaves open).
    for pod_set in workload["spec"]["podSets"]:
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
                                      "template": pod_set["template"]}, K8S_VERSION, strict=True)
    # The CRD's pod set limit, name pattern and list-map key hold.
    limits = WORKLOAD_CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["podSets"]
    assert len(workload["spec"]["podSets"]) <= limits["maxItems"] == 8


def test_a_config_change_keeps_the_workload_and_a_quota_change_replaces_it() -> None:
    base = workload_of(plan_of())
    same = workload_of(plan_of(grpo={"steps": 9999}, suspend=True))  # configs, and suspension (spec.active)
    assert not kueue.is_stale(base, same) and same["spec"]["active"] is False
    for changes in ({"engine": {"replicas": 3, "gpus": 1}}, {"queueName": "team-b"},
                    {"learner": {"gpus": 2}}, {"pod": {"nodeSelector": {"zone": "b"}}}):
        assert kueue.is_stale(base, workload_of(plan_of(**changes))), changes


def test_more_pools_than_pod_sets_are_refused_with_the_limit() -> None:
    with pytest.raises(PlanError) as refused:
        plan_of(harnesses=[{"pool": p} for p in sorted(POOLS)])
    assert refused.value.reason == "TooManyPodSets" and "at most 8 pod sets" in str(refused.value)


def test_admission_pins_each_component_to_its_flavors_nodes() -> None:
    plan = plan_of()
    flavors = {"engine": ["h100"], "learner": ["h100", "cpu-nodes"], "proxy": ["cpu-nodes"]}
    specs = {"h100": {"nodeLabels": {"gpu": "h100"}, "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]},
             "cpu-nodes": {"nodeLabels": {"pool": "cpu"}}}
    placed = kueue.place(plan, flavors, specs)
    manifests = {(m["kind"], m["metadata"]["name"]): m for m in render(placed, OWNER)}
    engine = manifests[("StatefulSet", "run-engine")]["spec"]["template"]["spec"]
    assert engine["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "gpu": "h100"}
    assert {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"} in engine["tolerations"]
    learner = manifests[("Job", "run-learner")]["spec"]["template"]["spec"]
    assert learner["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "gpu": "h100", "pool": "cpu"}
    runner = manifests[("Deployment", f"run-{plan.runners[0].pool}-runner")]["spec"]["template"]["spec"]
    assert runner.get("nodeSelector") == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}  # no assignment: unchanged


def test_a_stopped_plan_runs_nothing_and_keeps_every_config() -> None:
    plan = plan_of()
    before = {(m["kind"], m["metadata"]["name"]): m for m in render(plan, OWNER)}
    after = {(m["kind"], m["metadata"]["name"]): m for m in render(stopped(plan), OWNER)}
    assert after[("Job", "run-learner")]["spec"]["suspend"] is True
    assert all(m["spec"]["replicas"] == 0 for (kind, _), m in after.items() if kind in ("StatefulSet", "Deployment"))
    assert all(after[key]["data"] == m["data"] for key, m in before.items() if key[0] == "ConfigMap")


def test_release_and_finish_write_kueues_conditions() -> None:
    live = {"metadata": {"generation": 1}, "status": {
        "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "engine", "flavors": {"nvidia.com/gpu": "h100"}}]},
        "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"},
                       {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "by a higher priority",
                        "lastTransitionTime": "2026-01-01T00:01:00Z"}]}}
    assert kueue.holds_quota(live) and not kueue.is_admitted(live)
    assert kueue.assigned_flavors(live) == {"engine": ["h100"]}
    released = kueue.release_status(live, "2026-01-01T00:02:00Z")
    assert released["admission"] is None
    by_type = {c["type"]: c for c in released["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False" and by_type["QuotaReserved"]["reason"] == "Pending"
    assert by_type["QuotaReserved"]["lastTransitionTime"] == "2026-01-01T00:02:00Z"
    assert by_type["Admitted"]["status"] == "False" and by_type["Evicted"]["reason"] == "Preempted"  # kept
    finished = kueue.finished_status(live, succeeded=True, message="done", now="2026-01-01T00:03:00Z")
    assert {"type": "Finished", "status": "True", "reason": "Succeeded"}.items() <= finished["conditions"][-1].items()
