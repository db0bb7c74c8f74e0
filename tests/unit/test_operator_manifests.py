"""Plan -> manifests: every child passes `kubernetes-validate --strict`, carries the run's ownerReference and
labels, and holds what its component needs (GPUs, probes, volumes, RBAC, secrets as files)."""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from harnessrl.operator.api.harnesspool import HarnessPoolSpec
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.control.apply import drifted, holder, patch_body, quantity_value, replacement_reason
from harnessrl.operator.kube import Owner, proxy, render
from harnessrl.operator.kube import learner as learner_kube
from harnessrl.operator.kube.common import POD_PLACEHOLDER
from harnessrl.operator.plan import build_plan
from harnessrl.operator.plan.placement import CLUSTER_PATHS, ClusterPlacement
from harnessrl.runtime.contracts.engine_config import EngineConfig
from harnessrl.runtime.contracts.learner_config import LearnerConfig
from harnessrl.runtime.contracts.proxy_config import ProxyConfig
from harnessrl.runtime.contracts.runner_config import RunnerConfig

from tests.kube_emulator.builtin_rules import selector_matches, semantic_causes

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.31"
EXAMPLE = yaml.safe_load((ROOT / "examples" / "trainingrun.yaml").read_text())
POOLS = {
    p.stem: HarnessPoolSpec.model_validate(yaml.safe_load(p.read_text())["spec"])
    for p in (ROOT / "examples" / "harnesspools").glob("*.yaml")
}
OWNER = Owner(name="run", uid="0b7e6a52-7d0e-4c59-9a43-2f0e8d0c1a11")
LABELS = {"app.kubernetes.io/name", "app.kubernetes.io/component", "app.kubernetes.io/part-of",
          "app.kubernetes.io/managed-by", "harnessrl.io/run", "harnessrl.io/component"}


def manifests(**changes: Any) -> dict[tuple[str, str], dict[str, Any]]:
    spec = TrainingRunSpec.model_validate(EXAMPLE["spec"] | changes)
    plan = build_plan("run", "team", spec, POOLS, ClusterPlacement("team"))
    rendered = [*render(plan, OWNER), proxy.admin_secret(plan, OWNER, "s3cr3t-token"),
                learner_kube.runner_secret(plan, OWNER, "runner-s3cr3t")]
    return {(m["kind"], m["metadata"]["name"]): m for m in rendered}


VARIANTS = {
    "example": {},
    "all-pools": {"harnesses": [{"pool": p} for p in sorted(POOLS)], "queueName": None},  # > 8 pod sets: no Kueue
    "pvc-sources-cpu": {
        "model": {"base": {"pvc": {"claimName": "weights", "path": "qwen"}}, "adapter": {"lora": {}}},
        "tasks": {"image": {"image": "ghcr.io/org/tasks:v1"}},
        "engine": {"gpus": 0},
        "learner": {"gpus": 0},
        "harnesses": [{"pool": "claude-code"}],
        "export": None,
        "pod": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]}}}},
    },
    "suspended": {"suspend": True},
    "proxy-workers": {"proxy": {"replicas": 2, "workers": 2}},
    "nccl": {"model": {"base": {"hub": {"repo": "a/b"}}, "adapter": {"full": {}}},
             "engine": {"replicas": 1, "gpus": 4, "weightSync": "nccl"}},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_manifest_is_valid_owned_and_labelled(variant: str) -> None:
    for (kind, name), manifest in manifests(**VARIANTS[variant]).items():
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        meta = manifest["metadata"]
        assert meta["namespace"] == "team" and name.startswith("run-"), (kind, name)
        if (kind, name) == ("PersistentVolumeClaim", "run-checkpoints"):  # retained (the default): outlives the run
            assert "ownerReferences" not in meta and meta["labels"]["harnessrl.io/run-uid"] == OWNER.uid
        else:
            assert meta["ownerReferences"] == [OWNER.reference()], (kind, name)
        assert set(meta["labels"]) >= LABELS, (kind, name)
        assert meta["labels"]["harnessrl.io/run"] == "run"


def selectors(manifest: dict[str, Any]) -> list[dict[str, str]]:
    """Every label selector in a manifest (workloads, Services, NetworkPolicies and their peers)."""
    found: list[dict[str, str]] = []

    def walk(node: Any, key: str = "") -> None:
        if isinstance(node, dict):
            if key in ("selector", "podSelector"):
                found.append(node.get("matchLabels", node))
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for item in node:
                walk(item, key)

    walk(manifest.get("spec") or {})
    return found


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_selectors_use_only_the_operators_own_labels(variant: str) -> None:
    """Helm and Argo CD track their applications by app.kubernetes.io/instance: the operator neither sets it
    nor selects on app.kubernetes.io/* (immutable StatefulSet selectors must not depend on others' labels)."""
    seen = 0
    for (kind, name), manifest in manifests(**VARIANTS[variant]).items():
        assert "app.kubernetes.io/instance" not in manifest["metadata"]["labels"], (kind, name)
        for selector in selectors(manifest):
            seen += 1
            if selector == {"k8s-app": "kube-dns"}:  # a peer: the cluster's DNS Pods, by the cluster's own label
                continue
            assert selector and all(k.startswith("harnessrl.io/") or k.startswith("batch.kubernetes.io/")
                                    for k in selector), (kind, name, selector)
    assert seen >= 8


def test_engine_statefulset() -> None:
    m = manifests()
    sts = m[("StatefulSet", "run-engine")]
    pod = sts["spec"]["template"]["spec"]
    vllm = pod["containers"][0]
    assert sts["spec"]["serviceName"] == "run-engine" and m[("Service", "run-engine")]["spec"]["clusterIP"] == "None"
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == vllm["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
    assert {"name": "shm", "mountPath": "/dev/shm"} in vllm["volumeMounts"]
    assert vllm["startupProbe"]["httpGet"]["path"] == vllm["readinessProbe"]["httpGet"]["path"] == "/health"
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"} in vllm["env"]
    assert vllm["command"][:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enable-lora" in vllm["command"] and vllm["command"][vllm["command"].index("--max-lora-rank") + 1] == "32"
    # Pod overrides; no Kueue label: Kueue admits the whole run as one Workload, never a child on its own.
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "training"
    assert not any(k.startswith("kueue.x-k8s.io/") for m_ in m.values() for k in m_["metadata"].get("labels") or {})


def test_lora_engines_get_an_adapter_store_the_learner_uploads_to() -> None:
    m = manifests()  # weightSync lora, 2 engine replicas
    pod = m[("StatefulSet", "run-engine")]["spec"]["template"]["spec"]
    vllm, store = pod["containers"]
    # vLLM reads (only) the directory the store writes; only the store holds the token.
    assert {"name": "adapters", "mountPath": "/var/lib/harnessrl/adapters", "readOnly": True} in vllm["volumeMounts"]
    assert {"name": "adapters", "mountPath": "/var/lib/harnessrl/adapters"} in store["volumeMounts"]
    assert not any(mount["name"] == "adapter-store-token" for mount in vllm["volumeMounts"])
    token = next(v for v in pod["volumes"] if v["name"] == "adapter-store-token")["secret"]
    assert token["secretName"] == "run-proxy-admin" and pod["securityContext"]["fsGroup"] == 10001
    assert store["command"][:2] == ["harnessrl", "adapter-store"] and store["image"].split("/")[-1].startswith("proxy:")
    command = store["command"]
    assert command[command.index("--dir") + 1] == "/var/lib/harnessrl/adapters"
    assert command[command.index("--token-file") + 1] == "/var/run/secrets/harnessrl/proxy-admin/token"
    assert store["ports"] == [{"name": "adapters", "containerPort": 8001, "protocol": "TCP"}]
    learner = LearnerConfig.model_validate(yaml.safe_load(m[("ConfigMap", "run-learner-config")]["data"]["config.yaml"]))
    assert learner.engine.adapter_stores == [f"http://run-engine-{i}.run-engine.team.svc:8001" for i in (0, 1)]
    assert [u.split(":")[1] for u in learner.engine.urls] == [u.split(":")[1] for u in learner.engine.adapter_stores]
    assert str(learner.engine.adapter_store_token_file) == "/var/run/secrets/harnessrl/proxy-admin/token"
    # Other weight syncs need no store.
    nccl = manifests(**VARIANTS["nccl"])
    assert len(nccl[("StatefulSet", "run-engine")]["spec"]["template"]["spec"]["containers"]) == 1
    cfg = yaml.safe_load(nccl[("ConfigMap", "run-learner-config")]["data"]["config.yaml"])
    assert LearnerConfig.model_validate(cfg).engine.adapter_stores == []


def test_config_maps_hold_configs_the_components_load() -> None:
    m = manifests()
    loaded = {
        "run-engine-config": EngineConfig,
        "run-proxy-config": ProxyConfig,
        "run-learner-config": LearnerConfig,
        "run-codex-runner-config": RunnerConfig,
    }
    for name, model in loaded.items():
        text = m[("ConfigMap", name)]["data"]["config.yaml"].replace(POD_PLACEHOLDER, "pod-1")
        model.model_validate(yaml.safe_load(text))
    proxy_cfg = ProxyConfig.model_validate(yaml.safe_load(
        m[("ConfigMap", "run-proxy-config")]["data"]["config.yaml"].replace(POD_PLACEHOLDER, "run-proxy-1")))
    assert proxy_cfg.base_url() == "http://run-proxy-1.run-proxy-headless.team.svc:8080"
    assert proxy_cfg.replica_id == "run-proxy-1"


def test_the_learner_sets_the_policy_on_every_proxy_replica_at_the_url_it_advertises() -> None:
    """A Service reaches one replica per request, and each replica serves its own sessions: the learner must
    reach each one, at the URL that replica gives its sessions (its Pod's DNS name)."""
    m = manifests()
    replicas = m[("StatefulSet", "run-proxy")]["spec"]["replicas"]
    proxy_text = m[("ConfigMap", "run-proxy-config")]["data"]["config.yaml"]
    advertised = [
        ProxyConfig.model_validate(yaml.safe_load(proxy_text.replace(POD_PLACEHOLDER, f"run-proxy-{i}"))).base_url()
        for i in range(replicas)
    ]
    learner = LearnerConfig.model_validate(yaml.safe_load(m[("ConfigMap", "run-learner-config")]["data"]["config.yaml"]))
    assert replicas == 2 and learner.proxy.replica_urls == advertised
    assert learner.proxy.url == "http://run-proxy.team.svc:8080"  # sessions and sequences: any replica


def test_proxy_statefulset_and_admin_secret() -> None:
    m = manifests()
    sts = m[("StatefulSet", "run-proxy")]
    assert sts["spec"]["serviceName"] == "run-proxy-headless" and sts["spec"]["replicas"] == 2
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "journal"
    headless = m[("Service", "run-proxy-headless")]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    assert "clusterIP" not in m[("Service", "run-proxy")]["spec"]
    secret = m[("Secret", "run-proxy-admin")]
    assert base64.b64decode(secret["data"]["token"]).decode() == "s3cr3t-token"


def pod_secret_files(pod: dict[str, Any]) -> dict[str, str]:
    """Secret name -> the file its key is mounted at, in a Pod spec."""
    volumes = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    mounts = [m for c in pod["containers"] for m in c.get("volumeMounts", []) if m["name"] in volumes]
    return {volumes[m["name"]]["secretName"]: f"{m['mountPath']}/{volumes[m['name']]['items'][0]['path']}"
            for m in mounts}


def test_the_runner_token_secret_reaches_learner_proxy_and_runners_and_runners_get_no_admin_token() -> None:
    m = manifests()
    secret = m[("Secret", "run-runner-token")]
    assert base64.b64decode(secret["data"]["token"]).decode() == "runner-s3cr3t"
    assert secret["metadata"]["ownerReferences"] == [OWNER.reference()]
    plan = build_plan("run", "team", TrainingRunSpec.model_validate(EXAMPLE["spec"]), POOLS, ClusterPlacement("team"))
    # The file each pod gets is the one its config names: the learner and the proxy check the token, runners
    # send it.
    configs = [plan.learner.config, plan.proxy.config, *(r.config for r in plan.runners)]
    assert all(str(c.runner_token_file) == CLUSTER_PATHS["runner-token"] for c in configs)
    learner_pod = m[("Job", "run-learner")]["spec"]["template"]["spec"]
    runner_pods = [v["spec"]["template"]["spec"] for (kind, name), v in m.items()
                   if kind == "Deployment" and name.endswith("-runner")]
    assert len(runner_pods) == len(plan.runners) >= 1
    proxy_pod = m[("StatefulSet", "run-proxy")]["spec"]["template"]["spec"]
    for pod in [learner_pod, proxy_pod, *runner_pods]:
        assert pod_secret_files(pod)["run-runner-token"] == CLUSTER_PATHS["runner-token"]
    # A runner pod (whose harnesses run untrusted model output) holds no admin credential of the proxy.
    assert all("run-proxy-admin" not in pod_secret_files(pod) for pod in runner_pods)


def test_learner_job_secrets_are_files_never_literals() -> None:
    m = manifests()
    job = m[("Job", "run-learner")]
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["backoffLimit"] == 3 and pod["restartPolicy"] == "Never"
    assert job["spec"]["podReplacementPolicy"] == "Failed"
    learner = pod["containers"][0]
    assert learner["resources"]["limits"]["nvidia.com/gpu"] == "1"
    mounted = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert mounted == {"hf-token", "run-proxy-admin", "run-runner-token"}
    # Only the downward API (the Pod's IP) fills a variable: no Secret reaches it as one.
    assert all("fieldRef" in e["valueFrom"] for c in pod["containers"] for e in c.get("env", []) if "valueFrom" in e)
    checkpoints = next(v for v in pod["volumes"] if v["name"] == "checkpoints")
    assert checkpoints["persistentVolumeClaim"]["claimName"] == "qwen3-8b-checkpoints"
    assert ("PersistentVolumeClaim", "run-checkpoints") not in m  # the user's claim is used, none created
    assert [c["name"] for c in pod["initContainers"]] == ["base-model", "task-index"]
    # No secret value appears anywhere except in the Secret itself.
    for key, manifest in m.items():
        if key[0] != "Secret":
            assert "s3cr3t-token" not in yaml.safe_dump(manifest)


def test_runner_rbac_only_for_the_kubernetes_sandbox() -> None:
    m = manifests(harnesses=[{"pool": p} for p in sorted(POOLS)], queueName=None)
    for pool, spec in POOLS.items():
        name = f"run-{pool}-runner"
        kube_sandbox = spec.sandbox.kubernetes is not None
        assert (("RoleBinding", name) in m) == kube_sandbox and ("Role", name) not in m, pool
        pod = m[("Deployment", name)]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == name and pod["automountServiceAccountToken"] == kube_sandbox
        assert m[("Deployment", name)]["spec"]["replicas"] == spec.replicas
        # Each runner serves its /metrics where the chart's PodMonitor scrapes it.
        assert pod["containers"][0]["ports"] == [{"name": "metrics", "containerPort": 9102, "protocol": "TCP"}]
        assert yaml.safe_load(m[("ConfigMap", f"{name}-config")]["data"]["config.yaml"])["metrics_port"] == 9102
        if kube_sandbox:  # the chart's ClusterRole holds the rules (tests/unit/test_chart_harnessrl.py)
            assert m[("RoleBinding", name)]["roleRef"]["name"] == "harnessrl-sandbox"


def test_only_the_runs_own_pods_reach_its_learner_and_proxy() -> None:
    run = {"podSelector": {"matchLabels": {"harnessrl.io/run": "run", "harnessrl.io/component": "%s"}}}
    scrapers = {"namespaceSelector": {"matchLabels": {"harnessrl.io/metrics-scraper": "true"}}}
    learner = manifests()[("NetworkPolicy", "run-learner")]["spec"]
    coordinator, peers = learner["ingress"]
    assert coordinator["ports"] == [{"protocol": "TCP", "port": 8090}]
    assert coordinator["from"][0] == json.loads(json.dumps(run) % "runner") and coordinator["from"][2] == scrapers
    # The operator's Pods in its own namespace (the default one here), not any Pod labelled as the operator.
    assert coordinator["from"][1] == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "harnessrl-system"}},
                                      "podSelector": {"matchLabels": {"harnessrl.io/component": "operator"}}}
    assert peers == {"from": [json.loads(json.dumps(run) % k) for k in ("learner", "engine")]}  # any port
    # Without an E2B pool, the proxy takes calls only from the run's sandboxes, runners, learner and replicas.
    m = manifests(harnesses=[{"pool": "codex"}], eval=None)
    (rule,) = m[("NetworkPolicy", "run-proxy")]["spec"]["ingress"]
    assert rule["from"] == [*(json.loads(json.dumps(run) % k) for k in ("sandbox", "runner", "learner", "proxy")), scrapers]
    # E2B sandboxes call from outside the cluster, through the pool's proxyUrl: any source, the proxy's ports only.
    (open_rule,) = manifests()[("NetworkPolicy", "run-proxy")]["spec"]["ingress"]
    assert open_rule == {"ports": [{"protocol": "TCP", "port": 8080}]}


def test_sandboxes_reach_only_the_proxy() -> None:
    policy = manifests()[("NetworkPolicy", "run-sandboxes")]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"harnessrl.io/run": "run", "harnessrl.io/component": "sandbox"}
    assert policy["ingress"] == [] and set(policy["policyTypes"]) == {"Ingress", "Egress"}
    to_proxy, dns = policy["egress"]
    assert to_proxy["to"] == [{"podSelector": {"matchLabels": {"harnessrl.io/run": "run",
                                                               "harnessrl.io/component": "proxy"}}}]
    assert {p["port"] for p in dns["ports"]} == {53}
    # It selects the Pods the runners' kubernetes sandbox creates: the labels their config tells it to use.
    runner_cfg = RunnerConfig.model_validate(yaml.safe_load(
        manifests()[("ConfigMap", "run-codex-runner-config")]["data"]["config.yaml"].replace(POD_PLACEHOLDER, "p")))
    assert policy["podSelector"]["matchLabels"].items() <= runner_cfg.sandbox.labels.items()  # type: ignore[union-attr]


def test_suspended_run_keeps_its_checkpoints_and_suspends_the_learner() -> None:
    m = manifests(suspend=True, learner={"gpus": 1})
    assert m[("Job", "run-learner")]["spec"]["suspend"] is True
    assert m[("StatefulSet", "run-engine")]["spec"]["replicas"] == 0
    assert ("PersistentVolumeClaim", "run-checkpoints") in m


def test_patch_body_keeps_immutable_fields_out_and_drift_ignores_server_defaults() -> None:
    m = manifests(pod={})
    job = patch_body(m[("Job", "run-learner")])
    assert set(job["spec"]) == {"suspend", "parallelism"}
    sts = patch_body(m[("StatefulSet", "run-proxy")])
    assert "volumeClaimTemplates" not in sts["spec"] and "selector" not in sts["spec"]
    live = m[("StatefulSet", "run-proxy")] | {"status": {"replicas": 2}}
    live["spec"] = live["spec"] | {"revisionHistoryLimit": 10}
    assert not drifted(sts, live)
    live["spec"] = live["spec"] | {"replicas": 5}
    assert drifted(sts, live)


def test_a_workload_selecting_by_other_labels_is_replaced_not_patched() -> None:
    """Selectors of StatefulSets and Deployments, and a Job's Pod template, cannot change: a live one selecting
    by other labels (an older operator's app.kubernetes.io/instance) must be recreated."""
    m = manifests()
    old = {"app.kubernetes.io/instance": "run", "app.kubernetes.io/component": "proxy"}
    for kind, name in (("StatefulSet", "run-proxy"), ("Deployment", "run-codex-runner"), ("Job", "run-learner")):
        desired = m[(kind, name)]
        assert replacement_reason(desired, desired) is None, kind
        live = {**desired, "spec": {**desired["spec"], "template": {"metadata": {"labels": old}}}}
        if kind != "Job":
            live["spec"]["selector"] = {"matchLabels": old}
        assert replacement_reason(desired, live), kind
    # Labels the Job controller adds to the template, and the operator's informative ones, are no reason.
    job = m[("Job", "run-learner")]
    template = job["spec"]["template"]
    extra = {"batch.kubernetes.io/controller-uid": "u", "app.kubernetes.io/name": "other"}
    live = {**job, "spec": {**job["spec"], "template": {**template, "metadata": {"labels": template["metadata"]["labels"] | extra}}}}
    assert replacement_reason(job, live) is None
    assert replacement_reason(m[("Service", "run-proxy")], {}) is None


def test_checkpoints_outlive_the_run_unless_deleted_with_it_and_journals_never_do() -> None:
    retained = manifests(learner={"gpus": 1})[("PersistentVolumeClaim", "run-checkpoints")]["metadata"]
    assert "ownerReferences" not in retained
    assert retained["labels"]["harnessrl.io/run"] == "run" and retained["labels"]["harnessrl.io/run-uid"] == OWNER.uid
    deleted = manifests(learner={"gpus": 1, "checkpointRetention": "Delete"})[("PersistentVolumeClaim", "run-checkpoints")]["metadata"]
    assert deleted["ownerReferences"] == [OWNER.reference()] and deleted["labels"]["harnessrl.io/run-uid"] == OWNER.uid
    assert ("PersistentVolumeClaim", "run-checkpoints") not in manifests()  # the example names its own claim
    # The proxy's journals: owned by its StatefulSet (so gone with the run), kept while it is scaled to zero.
    sts = manifests()[("StatefulSet", "run-proxy")]["spec"]
    assert sts["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"}
    # Switching a live run between the two converges the claim's ownerReferences, never its spec.
    body = patch_body(manifests(learner={"gpus": 1})[("PersistentVolumeClaim", "run-checkpoints")])
    assert body == {"metadata": {"labels": retained["labels"], "ownerReferences": []}}
    assert not drifted(body, {"metadata": {"labels": retained["labels"]}, "spec": {}})
    assert drifted(body, {"metadata": {"labels": retained["labels"], "ownerReferences": [OWNER.reference()]}})


def test_a_child_held_by_another_owner_is_named_with_its_holder() -> None:
    desired = manifests()[("ConfigMap", "run-engine-config")]
    live = {"metadata": {"ownerReferences": [OWNER.reference()]}}
    assert holder(desired, live) is None
    assert holder(desired, {"metadata": {"ownerReferences": [{"kind": "Thing", "name": "t", "uid": "u"}, OWNER.reference()]}}) is None
    earlier = OWNER.reference() | {"uid": "earlier"}
    assert holder(desired, {"metadata": {"ownerReferences": [earlier]}}) == "TrainingRun run uid earlier (an earlier object of that name)"
    other = {"kind": "Deployment", "name": "d", "uid": "u1", "controller": True}
    assert holder(desired, {"metadata": {"ownerReferences": [{"kind": "Thing", "name": "t", "uid": "u"}, other]}}) == "Deployment d uid u1"
    assert holder(desired, {"metadata": {}}).startswith("no owner")  # type: ignore[union-attr]
    claim = manifests(learner={"gpus": 1})[("PersistentVolumeClaim", "run-checkpoints")]
    assert holder(claim, {"metadata": {"labels": claim["metadata"]["labels"]}}) is None
    assert holder(claim, {"metadata": {"ownerReferences": [OWNER.reference()]}}) is None  # retention was Delete
    kept = {"metadata": {"labels": claim["metadata"]["labels"] | {"harnessrl.io/run-uid": "earlier"}}}
    assert holder(claim, kept) == "the run run uid earlier, which kept it when it was deleted (checkpointRetention Retain)"


def test_task_index_init_container_lists_the_split(tmp_path: Path) -> None:
    """Run the learner's task-index init container program (as the Pod would, with its env) on the example
    task set: it must agree with the runner's own task loader on the ids of the split."""
    import subprocess
    import sys

    from harnessrl.runtime.harness.tasks import load_dir, split_tasks

    job = manifests(tasks={"pvc": {"claimName": "tasks"}, "split": "train", "limit": 5})[("Job", "run-learner")]
    index = next(c for c in job["spec"]["template"]["spec"]["initContainers"] if c["name"] == "task-index")
    env = {e["name"]: e["value"] for e in index["env"]}
    assert yaml.safe_load(env["HARNESSRL_TASKS"]) == {"kind": "dir", "path": "/var/lib/harnessrl/tasks"}
    # The example evaluates on the test split: the same program lists it, unlimited (the learner applies spec.eval.limit).
    assert env["HARNESSRL_EVAL_SPLIT"] == "test"
    assert env["HARNESSRL_EVAL_TASK_IDS"] == "/var/lib/harnessrl/task-ids/eval-ids.txt"
    out, eval_out = tmp_path / "ids.txt", tmp_path / "eval-ids.txt"
    env |= {"HARNESSRL_TASKS": f'{{"kind": "dir", "path": "{ROOT / "examples" / "tasks"}"}}', "HARNESSRL_TASK_IDS": str(out),
            "HARNESSRL_EVAL_TASK_IDS": str(eval_out)}
    command = [sys.executable if index["command"][0] == "python" else index["command"][0], *index["command"][1:]]
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=60)
    tasks = load_dir(ROOT / "examples" / "tasks")
    expected = sorted(split_tasks(tasks, "train"))[:5]
    assert out.read_text().split() == expected and len(expected) == 5
    held_out = sorted(split_tasks(tasks, "test"))
    assert eval_out.read_text().split() == held_out and held_out
    # The learner reads them from there.
    learner = yaml.safe_load(manifests()[("ConfigMap", "run-learner-config")]["data"]["config.yaml"])
    assert learner["eval"]["tasks"]["file"] == "/var/lib/harnessrl/task-ids/eval-ids.txt"


def test_task_index_lists_the_validation_split_apart(tmp_path: Path) -> None:
    """With spec.eval.validationSplit the same program writes the validation split's ids to their own file, and
    the learner's eval schedule reads them from there."""
    import subprocess
    import sys

    from tests.fixtures.task_splits import split_held_out

    tasks = tmp_path / "tasks"
    test, validation = split_held_out(ROOT / "examples" / "tasks", tasks)
    m = manifests(eval=EXAMPLE["spec"]["eval"] | {"validationSplit": "validation"})
    index = next(c for c in m[("Job", "run-learner")]["spec"]["template"]["spec"]["initContainers"]
                 if c["name"] == "task-index")
    env = {e["name"]: e["value"] for e in index["env"]}
    assert env["HARNESSRL_VALIDATION_SPLIT"] == "validation"
    out = {name: tmp_path / f"{name}.txt" for name in ("train", "eval", "validation")}
    env |= {"HARNESSRL_TASKS": f'{{"kind": "dir", "path": "{tasks}"}}', "HARNESSRL_SPLIT": "test",
            "HARNESSRL_TASK_IDS": str(out["train"]), "HARNESSRL_EVAL_TASK_IDS": str(out["eval"]),
            "HARNESSRL_VALIDATION_TASK_IDS": str(out["validation"])}
    subprocess.run([sys.executable, *index["command"][1:]], env=env, check=True, capture_output=True, timeout=60)
    assert out["eval"].read_text().split() == test
    assert out["validation"].read_text().split() == validation and validation
    learner = yaml.safe_load(m[("ConfigMap", "run-learner-config")]["data"]["config.yaml"])
    assert learner["eval"]["validation"]["file"] == "/var/lib/harnessrl/task-ids/validation-ids.txt"


def test_proxy_workers_get_their_own_ports_reachable_from_sandboxes() -> None:
    """With `proxy.workers`, each worker serves its sessions at its own port after the replica's: the Pod
    declares them, its config runs that many workers (the session limit split over them), and both the
    run-wide and the per-rollout NetworkPolicy let sandboxes reach them."""
    m = manifests(proxy={"replicas": 2, "workers": 3, "maxSessionsPerReplica": 100})
    container = m[("StatefulSet", "run-proxy")]["spec"]["template"]["spec"]["containers"][0]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [
        ("http", 8080), ("worker-0", 8081), ("worker-1", 8082), ("worker-2", 8083)]
    cfg = ProxyConfig.model_validate(yaml.safe_load(
        m[("ConfigMap", "run-proxy-config")]["data"]["config.yaml"].replace(POD_PLACEHOLDER, "run-proxy-0")))
    assert (cfg.workers, cfg.admission.max_sessions, cfg.journal_fsync) == (3, 34, True)
    assert cfg.journal_commit_delay_s == 0
    relaxed = manifests(proxy={"journalFsync": False, "journalCommitDelayMilliseconds": 2})[
        ("ConfigMap", "run-proxy-config")]["data"]["config.yaml"]
    relaxed_cfg = ProxyConfig.model_validate(yaml.safe_load(relaxed.replace(POD_PLACEHOLDER, "p")))
    assert (relaxed_cfg.journal_fsync, relaxed_cfg.journal_commit_delay_s) == (False, 0.002)
    to_proxy = m[("NetworkPolicy", "run-sandboxes")]["spec"]["egress"][0]
    assert to_proxy["ports"] == [{"protocol": "TCP", "port": 8080, "endPort": 8083}]
    runner = RunnerConfig.model_validate(yaml.safe_load(
        m[("ConfigMap", "run-codex-runner-config")]["data"]["config.yaml"].replace(POD_PLACEHOLDER, "p")))
    assert runner.sandbox.proxy_end_port == 8083  # type: ignore[union-attr]
    # One worker per replica (the default): the single port, as before.
    assert manifests()[("NetworkPolicy", "run-sandboxes")]["spec"]["egress"][0]["ports"] == [
        {"protocol": "TCP", "port": 8080}]


def test_user_labels_never_override_the_operators_own() -> None:
    clash = {"harnessrl.io/run": "other", "harnessrl.io/component": "oops", "team": "ml"}
    templates = 0
    for (kind, name), manifest in manifests(pod={"labels": clash}).items():
        template = (manifest.get("spec") or {}).get("template")
        if template is None:
            continue
        templates += 1
        labels = template["metadata"]["labels"]
        assert labels["team"] == "ml", (kind, name)
        assert labels["harnessrl.io/run"] == "run", (kind, name)
        assert labels["harnessrl.io/component"] != "oops", (kind, name)
        selector = manifest["spec"].get("selector")
        if selector is not None:  # a StatefulSet or Deployment still selects its own Pods
            assert selector_matches(selector, labels), (kind, name)
    assert templates >= 4


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_manifest_passes_the_api_servers_semantic_rules(variant: str) -> None:
    """What kubernetes-validate cannot see (selectors, requests <= limits, label syntax): the emulator's rules."""
    plurals = {"StatefulSet": ("apps", "statefulsets"), "Deployment": ("apps", "deployments"), "Job": ("batch", "jobs"),
               "Service": ("", "services"), "ConfigMap": ("", "configmaps"), "Secret": ("", "secrets"),
               "NetworkPolicy": ("networking.k8s.io", "networkpolicies")}
    for (kind, name), manifest in manifests(**VARIANTS[variant]).items():
        assert semantic_causes(plurals.get(kind, ("", kind.lower())), manifest) == [], (kind, name)


def test_resource_amounts_compare_as_quantities() -> None:
    """The API server stores quantities in canonical form (0.5 -> 500m, 1024Mi -> 1Gi): no drift, no patch."""
    desired = {"spec": {"containers": [{"resources": {"requests": {"cpu": 0.5, "memory": "1024Mi"},
                                                      "limits": {"cpu": 2, "nvidia.com/gpu": 1}}}]}}
    live = {"spec": {"containers": [{"resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                                   "limits": {"cpu": "2", "nvidia.com/gpu": "1"}}}]}}
    assert not drifted(desired, live)
    live["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "600m"
    assert drifted(desired, live)
    assert drifted({"requests": {"cpu": "1"}}, {"requests": {}}, "resources")


@pytest.mark.parametrize(("text", "amount"), [
    ("500m", "0.5"), (0.5, "0.5"), ("0.5", "0.5"), (".5", "0.5"), ("2", "2"), (2, "2"), ("1n", "1e-9"), ("1u", "1e-6"),
    ("1k", "1000"), ("1M", "1000000"), ("1G", "1e9"), ("1T", "1e12"), ("1Ki", "1024"), ("1Mi", "1048576"),
    ("1Gi", "1073741824"), ("1.5Gi", "1610612736"), ("1e3", "1000"), ("1E3", "1000"), ("1e-3", "0.001"), ("+1", "1"),
    ("1E", "1e18"), ("2Ei", str(2 * 2**60)), ("1P", "1e15"),
])
def test_quantity_value(text: Any, amount: str) -> None:
    assert quantity_value(text) == Decimal(amount)


@pytest.mark.parametrize("same", [("0.5", "500m"), ("1024Mi", "1Gi"), ("1e3", "1k"), ("1000m", 1), ("2048Ki", "2Mi"),
                                  ("1000M", "1G"), ("0", "0m")])
def test_equal_amounts_are_one_quantity(same: tuple[Any, Any]) -> None:
    assert quantity_value(same[0]) == quantity_value(same[1])
    assert not drifted({"limits": {"memory": same[0]}}, {"limits": {"memory": same[1]}})


@pytest.mark.parametrize("text", ["1K", "1ki", "1Gb", "abc", "", "1e", True, None, "1.2.3"])
def test_not_a_quantity(text: Any) -> None:
    assert quantity_value(text) is None


def test_pods_run_as_the_images_user_and_servers_on_a_read_only_root() -> None:
    m = manifests()
    engine = m[("StatefulSet", "run-engine")]["spec"]["template"]["spec"]
    vllm, store = engine["containers"]
    # vLLM's image runs as root; as the harnessrl user its caches go to a writable HOME on an emptyDir.
    assert engine["securityContext"]["runAsUser"] == 10001 and engine["securityContext"]["runAsNonRoot"] is True
    assert {"name": "HOME", "value": "/var/lib/harnessrl/home"} in vllm["env"]
    assert {"name": "home", "mountPath": "/var/lib/harnessrl/home"} in vllm["volumeMounts"]
    assert store["securityContext"]["readOnlyRootFilesystem"] is True
    proxy = m[("StatefulSet", "run-proxy")]["spec"]["template"]["spec"]
    # The proxy writes its per-replica config under /tmp, an emptyDir on its otherwise read-only root.
    assert proxy["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}
    assert {"name": "tmp", "mountPath": "/tmp"} in proxy["containers"][0]["volumeMounts"]


def test_gated_hub_sources_read_their_token_from_a_mounted_secret() -> None:
    """model.base.hub.tokenSecret and tasks.hub.tokenSecret: every container that downloads from the Hub gets
    the Secret as a file (HF_TOKEN_PATH for huggingface_hub, token_file for the runners); never a literal."""
    gated = {"name": "hf-read", "key": "token"}
    m = manifests(model={"base": {"hub": {"repo": "org/gated", "tokenSecret": gated}}, "adapter": {"lora": {}}},
                  tasks={"hub": {"repo": "org/gated-tasks", "tokenSecret": gated | {"name": "hf-tasks"}}})
    model_token, tasks_token = "/var/run/secrets/harnessrl/base-model-token", "/var/run/secrets/harnessrl/tasks-token"

    def mounted(pod: dict[str, Any], container: dict[str, Any], secret: str, directory: str) -> bool:
        volumes = {v["name"]: v.get("secret", {}).get("secretName") for v in pod["volumes"]}
        return any(volumes.get(mt["name"]) == secret and mt["mountPath"] == directory for mt in container["volumeMounts"])

    learner = m[("Job", "run-learner")]["spec"]["template"]["spec"]
    download, index = (c for c in learner["initContainers"] if c["name"] in ("base-model", "task-index"))
    assert {"name": "HF_TOKEN_PATH", "value": f"{model_token}/token"} in download["env"]
    assert mounted(learner, download, "hf-read", model_token) and mounted(learner, index, "hf-tasks", tasks_token)
    engine = m[("StatefulSet", "run-engine")]["spec"]["template"]["spec"]
    vllm = engine["containers"][0]
    assert {"name": "HF_TOKEN_PATH", "value": f"{model_token}/token"} in vllm["env"] and mounted(engine, vllm, "hf-read", model_token)
    runner = m[("Deployment", "run-codex-runner")]["spec"]["template"]["spec"]
    assert mounted(runner, runner["containers"][0], "hf-tasks", tasks_token)
    config = RunnerConfig.model_validate(yaml.safe_load(
        m[("ConfigMap", "run-codex-runner-config")]["data"]["config.yaml"].replace(POD_PLACEHOLDER, "p")))
    assert str(config.tasks.token_file) == f"{tasks_token}/token"  # type: ignore[union-attr]


def test_drains_spend_no_restart_budget_and_the_deadline_bounds_the_learner() -> None:
    job = manifests()[("Job", "run-learner")]["spec"]
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in (
        job["podFailurePolicy"]["rules"])
    assert "activeDeadlineSeconds" not in job
    assert manifests(activeDeadlineSeconds=86400)[("Job", "run-learner")]["spec"]["activeDeadlineSeconds"] == 86400
    jobset = manifests(activeDeadlineSeconds=600, learner={"gpus": 2, "nodes": 2})[("JobSet", "run-learner")]["spec"]
    assert jobset["replicatedJobs"][0]["template"]["spec"]["activeDeadlineSeconds"] == 600
    assert "DeadlineExceeded" in jobset["failurePolicy"]["rules"][0]["onJobFailureReasons"]


def test_two_tenants_runs_of_one_name_reach_only_their_own_namespace() -> None:
    """Team A and team B each run `shared` (no E2B pool): every network peer, URL, Secret and RBAC subject of
    A's run is A's own. Cross-namespace peers are only the operator's Pods in its namespace, admin-labelled
    scraper namespaces and the cluster's DNS Pods. (Tokens are generated per run by the operator; the coordinator and proxy refuse another's, see
    tests/integration/test_learner_coordinator.py and test_proxy_bad_input.py.)"""
    spec = TrainingRunSpec.model_validate(EXAMPLE["spec"] | {"harnesses": [{"pool": "codex"}], "eval": None})
    for ns in ("tenant-a", "tenant-b"):
        plan = build_plan("shared", ns, spec, POOLS, ClusterPlacement(ns))
        children = render(plan, Owner(name="shared", uid=f"uid-{ns}"))
        assert {m["metadata"]["namespace"] for m in children} == {ns}
        cross = []
        for policy in (m for m in children if m["kind"] == "NetworkPolicy"):
            for rule in [*policy["spec"].get("ingress", []), *policy["spec"].get("egress", [])]:
                for peer in [*rule.get("from", []), *rule.get("to", [])]:
                    if "namespaceSelector" in peer:
                        cross.append(peer)
                    else:  # the same namespace, and the run's own Pods only
                        assert peer["podSelector"]["matchLabels"]["harnessrl.io/run"] == "shared", peer
        named = [p["namespaceSelector"]["matchLabels"].get("kubernetes.io/metadata.name") for p in cross]
        assert all(p["namespaceSelector"] == {"matchLabels": {"harnessrl.io/metrics-scraper": "true"}}
                   or (name, p["podSelector"]) in (("harnessrl-system", {"matchLabels": {"harnessrl.io/component": "operator"}}),
                                                   ("kube-system", {"matchLabels": {"k8s-app": "kube-dns"}}))
                   for p, name in zip(cross, named, strict=True)), cross
        rendered = yaml.safe_dump(children)
        other = "tenant-b" if ns == "tenant-a" else "tenant-a"
        assert other not in rendered  # no URL, subject or reference into the other team's namespace
        assert f"shared-learner.{ns}.svc" in rendered and f"shared-proxy.{ns}.svc" in rendered
        binding = next(m for m in children if m["kind"] == "RoleBinding")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "shared-codex-runner", "namespace": ns}]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_volume_mount_names_a_volume_of_its_pod(variant: str) -> None:
    """A real API server refuses a Pod template whose mount names no volume (the emulator does not check it)."""
    for (kind, name), manifest in manifests(**VARIANTS[variant]).items():
        spec = manifest.get("spec") or {}
        template = spec.get("template") or ((spec.get("replicatedJobs") or [{}])[0].get("template") or {}).get("spec", {}).get("template")
        if not template:
            continue
        pod = template["spec"]
        volumes = {v["name"] for v in pod.get("volumes", [])} | {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])}
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            missing = {m["name"] for m in container.get("volumeMounts", [])} - volumes
            assert not missing, (kind, name, container["name"], missing)


def test_engine_variables_from_secrets_are_references_the_kubelet_resolves() -> None:
    env = [{"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}},
           {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}]
    out = manifests(engine=EXAMPLE["spec"]["engine"] | {"env": env})
    engine = out[("StatefulSet", "run-engine")]
    kubernetes_validate.validate(engine, K8S_VERSION, strict=True)
    container = engine["spec"]["template"]["spec"]["containers"][0]
    by_name = {e["name"]: e for e in container["env"]}
    assert by_name["AWS_SECRET_ACCESS_KEY"] == {"name": "AWS_SECRET_ACCESS_KEY",
                                                "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}}
    assert by_name["VLLM_LOGGING_LEVEL"]["value"] == "INFO"


def test_every_long_running_container_has_a_read_only_root_with_tmp_and_home_writable() -> None:
    out = manifests()
    workloads = [m for (kind, _), m in out.items() if kind in ("StatefulSet", "Deployment", "Job")]
    assert {m["metadata"]["labels"]["harnessrl.io/component"] for m in workloads} == {"engine", "proxy", "learner",
                                                                                        "runner"}
    for workload in workloads:
        for container in workload["spec"]["template"]["spec"]["containers"]:
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
            mounted = {m["mountPath"] for m in container["volumeMounts"]}
            if container["name"] != "adapter-store":  # it writes only its adapters volume
                assert "/tmp" in mounted, where
            home = next((e["value"] for e in container.get("env", []) if e["name"] == "HOME"), None)
            assert home is None or home in mounted, where
