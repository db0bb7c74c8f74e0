"""The kubernetes sandbox against the API emulator (tests/kube_emulator, over HTTP with the official client).

The emulator has no kubelet and no exec endpoint: a helper thread plays the kubelet (marks Pods Running), and a
command in the Pod cannot run here — so these tests cover the objects, their lifecycle and reaping, and that a
Pod whose exec fails is deleted; running a harness inside a Pod needs a real cluster.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from harnessrl.runtime.harness.config import KubernetesSandboxConfig, Resources
from harnessrl.runtime.harness.sandboxes.base import SandboxError
from harnessrl.runtime.harness.sandboxes.kubernetes import KubernetesProvider
from harnessrl.runtime.harness.tasks import load_dir

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"
POOL_SANDBOX = KubernetesSandboxConfig(
    namespace="default",
    image="ghcr.io/harnessrl/harness-claude-code:2.1.197",
    runtime_class_name="gvisor",
    resources=Resources(requests={"cpu": "500m", "memory": "1Gi"}, limits={"cpu": "2", "memory": "4Gi"}),
    node_selector={"pool": "agents"},
    labels={"team": "rl"},
    proxy_pod_labels={"app.kubernetes.io/name": "harnessrl-proxy"},
    proxy_port=8080,
    pod_start_timeout_s=10,
)
SELECTOR = "app.kubernetes.io/managed-by=harnessrl"


def provider(kube_api: Any, runner_id: str = "runner-0") -> KubernetesProvider:
    return KubernetesProvider(POOL_SANDBOX, pool="claude-pool", runner_id=runner_id, api_client=kube_api.client())


def sandboxes(kube_api: Any) -> tuple[list[str], list[str]]:
    pods = kube_api.list_objects("v1", "Pod", "default", label_selector=SELECTOR)
    policies = kube_api.list_objects("networking.k8s.io/v1", "NetworkPolicy", "default", label_selector=SELECTOR)
    return sorted(p["metadata"]["name"] for p in pods), sorted(p["metadata"]["name"] for p in policies)


def test_pod_and_network_policy_are_what_the_pool_says(kube_api: Any) -> None:
    prov = provider(kube_api)
    name = prov.create("rollout-1")
    pod = kube_api.get("v1", "Pod", name, "default")
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "gvisor" and spec["nodeSelector"] == {"pool": "agents"}
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert spec["activeDeadlineSeconds"] > 0 and "ownerReferences" not in pod["metadata"]
    (container,) = spec["containers"]
    assert container["image"] == POOL_SANDBOX.image
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/workspace", "/home/agent", "/tests", "/logs"}
    labels = pod["metadata"]["labels"]
    assert labels == {"team": "rl", "app.kubernetes.io/managed-by": "harnessrl", "harnessrl.io/pool": "claude-pool",
                      "harnessrl.io/runner": "runner-0", "harnessrl.io/rollout": "rollout-1", "harnessrl.io/sandbox": name}

    policy = kube_api.get("networking.k8s.io/v1", "NetworkPolicy", name, "default")["spec"]
    assert policy["podSelector"] == {"matchLabels": {"harnessrl.io/sandbox": name}}
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["ingress"] == []
    to_proxy, to_dns = policy["egress"]
    assert to_proxy == {"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "harnessrl-proxy"}}}],
                        "ports": [{"protocol": "TCP", "port": 8080}]}
    assert {p["port"] for p in to_dns["ports"]} == {53}
    assert to_dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}

    prov.delete(name)
    assert sandboxes(kube_api) == ([], [])


def play_kubelet(kube_api: Any, stop: threading.Event) -> None:
    """Mark every sandbox Pod Running, as a kubelet would once its container started."""
    while not stop.wait(0.05):
        for pod in kube_api.list_objects("v1", "Pod", "default", label_selector=SELECTOR):
            if (pod.get("status") or {}).get("phase") != "Running":
                kube_api.patch("v1", "Pod", pod["metadata"]["name"], {"status": {"phase": "Running"}}, "default",
                               subresource="status")


async def test_pod_is_deleted_when_its_rollout_fails(kube_api: Any) -> None:
    task = load_dir(TASKS)["sales-total"]
    prov = provider(kube_api)
    stop = threading.Event()
    kubelet = threading.Thread(target=play_kubelet, args=(kube_api, stop), daemon=True)
    kubelet.start()
    try:
        # Running, then copying the task in through exec fails (no exec here): the sandbox is torn down.
        with pytest.raises(SandboxError, match="exec"):
            await prov.open("rollout-2", task)
    finally:
        stop.set()
        kubelet.join(5)
    assert sandboxes(kube_api) == ([], []) and prov.open_sandboxes == {}


async def test_orphans_reaped_on_start_and_all_deleted_on_shutdown(kube_api: Any) -> None:
    crashed = provider(kube_api)  # an earlier runner of this pool that died mid-rollout
    orphans = [crashed.create("r-a"), crashed.create("r-b")]
    other = provider(kube_api, runner_id="runner-1").create("r-c")  # another runner's: must survive
    assert sandboxes(kube_api)[0] == sorted([*orphans, other])

    restarted = provider(kube_api)
    await restarted.start()
    assert sandboxes(kube_api) == ([other], [other])

    live = [await asyncio.to_thread(restarted.create, f"r-{i}") for i in range(2)]
    assert sandboxes(kube_api)[0] == sorted([*live, other])
    await restarted.shutdown()
    assert sandboxes(kube_api) == ([other], [other])
