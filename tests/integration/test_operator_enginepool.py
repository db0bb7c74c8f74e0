"""EnginePools through the operator (kopf over HTTP) against the API emulator: a pool's servers, two runs on one
pool with no engine of their own, their EngineReady following the pool's servers, and a run blocked with a reason
while its pool is missing. The emulator runs no controllers: the test writes the pool's StatefulSet status as the
StatefulSet controller would."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.integration.test_operator_reconcile import (  # noqa: F401 (fixtures)
    NS,
    ROOT,
    TR,
    apply_pools,
    children,
    cluster,
    learner_status,
    operator,
    ready_workload,
    small_run,
    wait_condition,
)

pytestmark = pytest.mark.timeout(90)
EP = ("harnessrl.io/v1alpha1", "EnginePool")
POOL = yaml.safe_load((ROOT / "examples" / "enginepools" / "qwen3-8b.yaml").read_text())
BASE = {"hub": {"repo": "Qwen/Qwen3-0.6B"}}


def engine_pool(replicas: int = 1) -> dict[str, Any]:
    spec = POOL["spec"] | {"model": {"base": BASE, "servedName": "qwen3"},
                           "engine": POOL["spec"]["engine"] | {"replicas": replicas}}
    return {"apiVersion": EP[0], "kind": EP[1], "metadata": {"name": "shared", "namespace": NS}, "spec": spec}


def on_pool(name: str) -> dict[str, Any]:
    return small_run(name, engine={"pool": "shared"})


def pool_status(kube: Any) -> dict[str, Any]:
    return (kube.get(*EP, "shared", namespace=NS) or {}).get("status") or {}


def config_of(kube: Any, configmap: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(kube.get("v1", "ConfigMap", configmap, namespace=NS)["data"]["config.yaml"])
    return data


def test_two_runs_share_one_pool_and_follow_its_servers(operator: Any) -> None:  # noqa: F811 (the fixture)
    apply_pools(operator, "mini-swe-agent")
    operator.apply(engine_pool())
    servers = operator.wait_for(lambda: operator.get("apps/v1", "StatefulSet", "shared-enginepool", namespace=NS),
                                timeout=15)
    assert servers["metadata"]["ownerReferences"][0]["kind"] == "EnginePool"
    assert operator.get("v1", "Secret", "shared-enginepool-store", namespace=NS) is not None
    assert operator.get("networking.k8s.io/v1", "NetworkPolicy", "shared-enginepool", namespace=NS) is not None
    operator.wait_for(lambda: pool_status(operator).get("phase") == "Pending", timeout=15)

    for run in ("run-a", "run-b"):
        operator.apply(on_pool(run))
    operator.wait_for(lambda: pool_status(operator).get("runs") == ["run-a", "run-b"], timeout=15)
    for run in ("run-a", "run-b"):
        operator.wait_for(lambda run=run: ("StatefulSet", f"{run}-proxy") in children(operator, run), timeout=15)
        assert ("StatefulSet", f"{run}-engine") not in children(operator, run)
        proxy = config_of(operator, f"{run}-proxy-config")
        assert proxy["upstream_urls"] == ["http://shared-enginepool-0.shared-enginepool.default.svc:8000/"]
        assert proxy["served_model"] == "qwen3"
        learner = config_of(operator, f"{run}-learner-config")
        assert learner["model"]["adapter_prefix"] == run
        assert learner["engine"]["adapter_stores"] == ["http://shared-enginepool-0.shared-enginepool.default.svc:8001"]
        # Not ready until the pool's servers are.
        wait_condition(operator, run, "EngineReady", "False", "ReplicasNotReady")

    # The pool's servers become ready: so does each run's engine.
    ready_workload(operator, "apps/v1", "StatefulSet", "shared-enginepool", 1)
    for run in ("run-a", "run-b"):
        wait_condition(operator, run, "EngineReady", "True", "AllReplicasReady")
    operator.wait_for(lambda: pool_status(operator).get("phase") == "Ready", timeout=15)
    assert pool_status(operator)["readyReplicas"] == 1

    # A second server: the runs' proxies and learners are pointed at both.
    operator.patch(*EP, "shared", {"spec": {"engine": {"replicas": 2}}}, namespace=NS)
    operator.wait_for(lambda: len(config_of(operator, "run-a-proxy-config")["upstream_urls"]) == 2, timeout=15)


def test_a_run_waits_with_a_reason_until_its_pool_exists(operator: Any) -> None:  # noqa: F811 (the fixture)
    apply_pools(operator, "mini-swe-agent")
    operator.apply(on_pool("run-a"))
    ready = wait_condition(operator, "run-a", "Ready", "False", "EnginePoolUnavailable")
    assert "EnginePool shared not found" in ready["message"]
    assert children(operator, "run-a") == set()

    operator.apply(engine_pool())
    operator.wait_for(lambda: ("StatefulSet", "run-a-proxy") in children(operator, "run-a"), timeout=15)
    wait_condition(operator, "run-a", "EngineReady", "False", "ReplicasNotReady")

    # A pool of another base model cannot serve it.
    other = engine_pool()
    other["spec"]["model"] = {"base": {"hub": {"repo": "Qwen/Qwen3-8B"}}, "servedName": "qwen3"}
    operator.delete(*EP, "shared", NS)
    operator.apply(other)
    ready = wait_condition(operator, "run-a", "Ready", "False", "EnginePoolUnavailable")
    assert "another base model" in ready["message"]
