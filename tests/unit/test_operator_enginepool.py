"""EnginePool -> its servers, and a run on the pool -> a run with no engine of its own that samples from the pool's
servers under its own adapter name. Every manifest passes `kubernetes-validate --strict`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from harnessrl.operator.api import reasons as R
from harnessrl.operator.api.enginepool import EnginePoolSpec
from harnessrl.operator.api.harnesspool import HarnessPoolSpec
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.handlers.adapters import orphans
from harnessrl.operator.handlers.status import (
    Observed,
    QueueState,
    engine_pool_held,
    engine_pool_status,
    run_status,
)
from harnessrl.operator.kube import Owner, engine, kueue, render
from harnessrl.operator.kube.common import selector
from harnessrl.operator.plan import build_plan, stopped
from harnessrl.operator.plan.engine import build_engine_pool_plan
from harnessrl.operator.plan.placement import CLUSTER_PATHS, ClusterPlacement
from harnessrl.operator.plan.types import ComponentKind, EnginePoolUnavailable, PlanError
from harnessrl.runtime.contracts.engine_config import EngineConfig
from harnessrl.runtime.contracts.learner_config import LearnerConfig
from harnessrl.runtime.contracts.proxy_config import ProxyConfig

from harnessrl.local.run import LocalPlacement

ROOT = Path(__file__).resolve().parents[2]
POOL = yaml.safe_load((ROOT / "examples" / "enginepools" / "qwen3-8b.yaml").read_text())
RUN = yaml.safe_load((ROOT / "examples" / "enginepools" / "run-on-pool.yaml").read_text())
CODEX = HarnessPoolSpec.model_validate(yaml.safe_load((ROOT / "examples" / "harnesspools" / "codex.yaml").read_text())["spec"])
POOL_OWNER = Owner(name="qwen3-8b", uid="5c1f6f9e-0d4b-4f7e-9a57-3f1d8a2b9c10", kind="EnginePool")
RUN_OWNER = Owner(name="team-a-codex", uid="0b7e6a52-7d0e-4c59-9a43-2f0e8d0c1a11")
K8S_VERSION = "1.31"


def pool_spec(**changes: Any) -> EnginePoolSpec:
    return EnginePoolSpec.model_validate(POOL["spec"] | changes)


def run_plan(name: str = "team-a-codex", pool: EnginePoolSpec | None = None, **changes: Any) -> Any:
    spec = TrainingRunSpec.model_validate(RUN["spec"] | changes)
    return build_plan(name, "team", spec, {"codex": CODEX}, ClusterPlacement("team"), engine_pool=pool or pool_spec())


def pool_plan(**changes: Any) -> Any:
    return build_engine_pool_plan("qwen3-8b", "team", pool_spec(**changes), ClusterPlacement("team"))


def pool_workload(**changes: Any) -> dict[str, Any]:
    """The pool's Workload as handlers/admission.py builds it."""
    return kueue.desired_workload(pool_plan(**changes), POOL_OWNER, engine.pool_manifests)


def by_name(manifests: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


def test_a_pool_serves_lora_with_an_adapter_store_beside_each_server_and_admits_only_its_runs() -> None:
    plan = build_engine_pool_plan("qwen3-8b", "team", pool_spec(), ClusterPlacement("team"))
    out = by_name([*engine.pool_manifests(plan, POOL_OWNER), engine.store_secret(plan, POOL_OWNER, "t0ken")])
    for manifest in out.values():
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        assert manifest["metadata"]["ownerReferences"][0]["kind"] == "EnginePool"
    servers = out[("StatefulSet", "qwen3-8b-enginepool")]
    # Selected by the pool's label, not a run's: a run named like the pool selects none of its Pods.
    assert servers["spec"]["selector"]["matchLabels"] == {"harnessrl.io/engine-pool": "qwen3-8b",
                                                          "harnessrl.io/component": "enginepool"}
    assert "harnessrl.io/run" not in servers["spec"]["template"]["metadata"]["labels"]
    assert servers["spec"]["replicas"] == 2
    vllm, store = servers["spec"]["template"]["spec"]["containers"]
    argv = vllm["command"]
    assert argv[argv.index("--max-lora-rank") + 1] == "64" and argv[argv.index("--max-loras") + 1] == "8"
    assert argv[argv.index("--served-model-name") + 1] == "qwen3-8b"
    assert store["name"] == "adapter-store"
    volumes = {v["name"]: v for v in servers["spec"]["template"]["spec"]["volumes"]}
    assert volumes["adapter-store-token"]["secret"]["secretName"] == "qwen3-8b-enginepool-store"
    assert out[("Service", "qwen3-8b-enginepool")]["spec"]["clusterIP"] == "None"
    policy = out[("NetworkPolicy", "qwen3-8b-enginepool")]["spec"]
    assert policy["podSelector"]["matchLabels"] == servers["spec"]["selector"]["matchLabels"]
    runs, operator = policy["ingress"][0]["from"][:2], policy["ingress"][0]["from"][2:]
    assert [peer["podSelector"]["matchLabels"] for peer in runs] == [
        {"harnessrl.io/engine-pool": "qwen3-8b", "harnessrl.io/component": c} for c in ("proxy", "learner")]
    # The operator's Pods in the operator's namespace, which unload the adapters of runs that are gone.
    assert operator == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "harnessrl-system"}},
                         "podSelector": {"matchLabels": {"harnessrl.io/component": "operator"}}}]


def test_a_run_on_a_pool_has_no_engine_and_samples_the_pools_servers_under_its_own_name() -> None:
    plan = run_plan()
    assert plan.engine is None and plan.adapter_store is None and plan.engine_pool == "qwen3-8b"
    servers = [f"http://qwen3-8b-enginepool-{i}.qwen3-8b-enginepool.team.svc:8000" for i in range(2)]
    stores = [url.replace(":8000", ":8001") for url in servers]
    proxy = plan.proxy.config
    assert isinstance(proxy, ProxyConfig)
    assert [str(u).rstrip("/") for u in proxy.upstream_urls] == servers and proxy.served_model == "qwen3-8b"
    learner = plan.learner.config
    assert isinstance(learner, LearnerConfig)
    assert learner.engine.urls == servers and learner.engine.adapter_stores == stores
    assert learner.engine.adapter_store_token_file == Path(CLUSTER_PATHS["adapter-store-token"])
    assert learner.model.served_name == "qwen3-8b" and learner.model.adapter_name_prefix == "team-a-codex"
    # The run's own store credential (it writes only the run's adapters), never the pool's token.
    assert [s.secret for s in plan.learner.secrets if s.path == CLUSTER_PATHS["adapter-store-token"]] == [
        "team-a-codex-adapter-store"]
    # The pool's servers set the context length the learner plans for.
    assert learner.grpo.dr_grpo_tokens == 40960

    out = by_name(render(plan, RUN_OWNER))
    for manifest in out.values():
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    assert not any(kind == "StatefulSet" and name.endswith("-engine") for kind, name in out)
    assert ("NetworkPolicy", "team-a-codex-engine") not in out
    # The pool's NetworkPolicy admits the run's proxy and learner by this label.
    proxy_pods = out[("StatefulSet", "team-a-codex-proxy")]["spec"]["template"]["metadata"]["labels"]
    learner_pods = out[("Job", "team-a-codex-learner")]["spec"]["template"]["metadata"]["labels"]
    assert proxy_pods["harnessrl.io/engine-pool"] == learner_pods["harnessrl.io/engine-pool"] == "qwen3-8b"
    runner_pods = out[("Deployment", "team-a-codex-codex-runner")]["spec"]["template"]["metadata"]["labels"]
    assert "harnessrl.io/engine-pool" not in runner_pods
    # The pool's GPUs are not the run's to queue.
    queued = run_plan(queueName="team-queue")
    assert [name for name, _ in kueue.pod_set_components(queued)] == ["learner", "proxy", "runner-0"]


def test_two_runs_on_one_pool_publish_under_different_names() -> None:
    a, b = (run_plan(name).learner.config for name in ("team-a-codex", "team-b-codex"))
    assert isinstance(a, LearnerConfig) and isinstance(b, LearnerConfig)
    assert a.engine.urls == b.engine.urls
    assert a.model.adapter_name_prefix != b.model.adapter_name_prefix


@pytest.mark.parametrize(
    ("pool", "changes", "says"),
    [
        (None, {}, "EnginePool qwen3-8b not found in namespace team"),
        (pool_spec(model={"base": {"hub": {"repo": "Qwen/Qwen3-4B"}}}), {}, "another base model"),
        (pool_spec(lora={"maxRank": 16}), {}, "lora.rank 32 is above EnginePool qwen3-8b's lora.maxRank 16"),
    ],
)
def test_a_pool_that_cannot_serve_the_run_blocks_it_with_a_reason(
    pool: EnginePoolSpec | None, changes: dict[str, Any], says: str
) -> None:
    spec = TrainingRunSpec.model_validate(RUN["spec"] | changes)
    with pytest.raises(EnginePoolUnavailable, match=says) as raised:
        build_plan("team-a-codex", "team", spec, {"codex": CODEX}, ClusterPlacement("team"), engine_pool=pool)
    assert raised.value.reason == R.ENGINE_POOL_UNAVAILABLE


def test_harnessrl_run_has_no_engine_pools(tmp_path: Path) -> None:
    spec = TrainingRunSpec.model_validate(RUN["spec"])
    placement = LocalPlacement(tmp_path, tmp_path / "model", tmp_path / "tasks", engine_replicas=1, proxy_workers=1)
    with pytest.raises(PlanError, match="only a cluster has EnginePools"):
        build_plan("team-a-codex", "team", spec, {"codex": CODEX}, placement, engine_pool=pool_spec())


def test_the_pool_servers_selector_differs_from_a_same_named_runs_engine() -> None:
    assert selector("qwen3-8b", ComponentKind.ENGINE_POOL) != selector("qwen3-8b", ComponentKind.ENGINE)
    plan = build_engine_pool_plan("qwen3-8b", "team", pool_spec(), ClusterPlacement("team"))
    assert isinstance(plan.engine.config, EngineConfig) and plan.engine.config.lora.enabled


def test_orphans_are_the_adapters_of_runs_gone_from_the_pool() -> None:
    served = ["qwen3-8b", "team-a-v3", "team-a-v4", "team-b-v1", "old-run-v12", "adapter-by-hand", "x-v1-eval"]
    assert orphans(served, ["team-a", "team-b"]) == ["old-run-v12"]
    assert orphans(served, []) == ["team-a-v3", "team-a-v4", "team-b-v1", "old-run-v12"]


def test_a_queued_pool_is_one_workload_whose_engine_pod_set_counts_its_servers() -> None:
    workload = pool_workload(queueName="gpus")
    meta = workload["metadata"]
    assert meta["name"] == "qwen3-8b" and meta["ownerReferences"] == [POOL_OWNER.reference()]
    assert meta["ownerReferences"][0]["controller"] is True
    assert meta["labels"]["harnessrl.io/engine-pool"] == "qwen3-8b"  # the operator's watch finds the pool by it
    assert workload["spec"]["queueName"] == "gpus" and workload["spec"]["active"] is True
    [servers] = workload["spec"]["podSets"]
    assert servers["name"] == "engine" and servers["count"] == POOL["spec"]["engine"]["replicas"] == 2
    vllm, store = servers["template"]["spec"]["containers"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1" and set(vllm) == {"name", "image", "resources"}
    assert "nvidia.com/gpu" not in store["resources"]["limits"]
    # A valid core/v1 PodTemplateSpec (the part the fixture CRD leaves open).
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
                                  "template": servers["template"]}, K8S_VERSION, strict=True)
    # What quota counts replaces the Workload; adapter capacity (a server flag) does not.
    engine_spec = POOL["spec"]["engine"]
    for changes in ({"engine": engine_spec | {"replicas": 3}}, {"engine": engine_spec | {"gpus": 2}},
                    {"queueName": "other"}, {"pod": {"nodeSelector": {"zone": "b"}}}):
        assert kueue.is_stale(workload, pool_workload(**({"queueName": "gpus"} | changes))), changes
    assert not kueue.is_stale(workload, pool_workload(queueName="gpus", lora={"maxLoras": 16}))


def test_a_pool_runs_no_server_until_admitted_then_on_its_flavors_nodes() -> None:
    plan = pool_plan(queueName="gpus")
    held = by_name(engine.pool_manifests(stopped(plan), POOL_OWNER))[("StatefulSet", "qwen3-8b-enginepool")]
    assert held["spec"]["replicas"] == 0
    toleration = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    placed = kueue.place(plan, {"engine": ["h100"]}, {"h100": {"nodeLabels": {"gpu": "h100"}, "tolerations": [toleration]}})
    servers = by_name(engine.pool_manifests(placed, POOL_OWNER))[("StatefulSet", "qwen3-8b-enginepool")]
    assert servers["spec"]["replicas"] == 2
    assert servers["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert servers["spec"]["template"]["spec"]["tolerations"] == [toleration]
    # A queued run on the pool is placed without an engine of its own.
    run = kueue.place(run_plan(queueName="team-queue"), {"learner": ["h100"]}, {"h100": {"nodeLabels": {"gpu": "h100"}}})
    assert run.engine is None and run.learner.pod.node_selector == {"gpu": "h100"}


def test_a_pool_kueue_holds_back_says_so_and_so_do_its_runs() -> None:
    waiting = QueueState(admitted=False, reason=R.AWAITING_ADMISSION, message="Workload qwen3-8b waits for Kueue")
    servers = {"spec": {"replicas": 0}, "status": {"readyReplicas": 0}}
    status = engine_pool_status(1, None, servers, [], ["team-a-codex"], waiting)
    ready = status.conditions[0]
    assert (ready.type, ready.status, ready.reason) == ("Ready", "False", R.AWAITING_ADMISSION)
    assert status.phase == "Pending" and ready.message == waiting.message
    body = {"status": status.model_dump(mode="json", by_alias=True)}
    held = engine_pool_held("qwen3-8b", body)
    assert held is not None and held.reason == R.AWAITING_ADMISSION
    run = run_status(TrainingRunSpec.model_validate(RUN["spec"]), 1, None,
                     Observed(engine=servers, engine_pods=[], engine_pool_held=held))
    engine_ready = next(c for c in run.conditions if c.type == "EngineReady")
    assert engine_ready.reason == R.AWAITING_ADMISSION
    assert engine_ready.message.startswith("EnginePool qwen3-8b awaits Kueue's admission: Workload qwen3-8b waits")
    # Admitted: the pool's own readiness, and nothing held.
    admitted = engine_pool_status(1, status, servers | {"spec": {"replicas": 2}}, [], [], QueueState(admitted=True))
    assert admitted.conditions[0].reason == R.REPLICAS_NOT_READY
    assert engine_pool_held("qwen3-8b", {"status": admitted.model_dump(mode="json", by_alias=True)}) is None


def test_a_pools_servers_require_a_key_that_only_its_runs_proxies_and_learners_hold() -> None:
    """vLLM checks VLLM_API_KEY on /v1 (runtime LoRA load and unload among it): the pool's servers get it from the
    pool's Secret, and of a run on the pool only the proxy and the learner mount it (runners and sandboxes never)."""
    plan = pool_plan()
    out = by_name(engine.pool_manifests(plan, POOL_OWNER))
    vllm, store = out[("StatefulSet", "qwen3-8b-enginepool")]["spec"]["template"]["spec"]["containers"]
    (key,) = [e for e in vllm["env"] if e["name"] == "VLLM_API_KEY"]
    assert key["valueFrom"]["secretKeyRef"] == {"name": "qwen3-8b-enginepool-api-key", "key": "token"}
    assert "env" not in store or all(e["name"] != "VLLM_API_KEY" for e in store["env"])
    secret = engine.api_key_secret(plan, POOL_OWNER, "k3y")
    assert secret["metadata"]["name"] == "qwen3-8b-enginepool-api-key"
    assert secret["metadata"]["ownerReferences"] == [POOL_OWNER.reference()]

    run = by_name(render(run_plan(), RUN_OWNER))
    holders = {}
    for (kind, name), manifest in run.items():
        if kind in ("StatefulSet", "Job", "Deployment"):
            volumes = manifest["spec"]["template"]["spec"].get("volumes", [])
            holders[name] = any((v.get("secret") or {}).get("secretName") == "qwen3-8b-enginepool-api-key"
                                for v in volumes)
    assert holders == {"team-a-codex-proxy": True, "team-a-codex-learner": True, "team-a-codex-codex-runner": False}
    key_file = CLUSTER_PATHS["engine-api-key"]
    assert yaml.safe_load(run[("ConfigMap", "team-a-codex-proxy-config")]["data"]["config.yaml"])[
        "engine_api_key_file"] == key_file
    assert yaml.safe_load(run[("ConfigMap", "team-a-codex-learner-config")]["data"]["config.yaml"])["engine"][
        "api_key_file"] == key_file
