"""EnginePools through the operator (kopf over HTTP) against the API emulator: a pool's servers, two runs on one
pool with no engine of their own, their EngineReady following the pool's servers, a run blocked with a reason
while its pool is missing, and the adapters of a deleted run unloaded from the pool. The emulator runs no
controllers: the test writes the pool's StatefulSet status as the StatefulSet controller would. The pool's server
is the scripted engine (vLLM's LoRA endpoints) and its adapter store the real one, both on 127.0.0.1, where the
operator's URL templates send it (in a cluster: the servers' Pod DNS names)."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from harnessrl.operator.handlers import Context, OperatorOptions, build_registry
from harnessrl.operator.kube.common import labels
from harnessrl.operator.plan.types import ComponentKind
from harnessrl.runtime.contracts.store_credentials import run_credential
from harnessrl.runtime.engine.adapter_store import adapter_tar, create_app
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_operator_reconcile import (  # noqa: F401 (fixtures)
    NS,
    ROOT,
    TR,
    FakeLearnerStatus,
    apply_pools,
    children,
    cluster,
    learner_status,
    ready_workload,
    small_run,
    wait_condition,
)
from tests.ports import free_port

pytestmark = pytest.mark.timeout(90)
EP = ("harnessrl.io/v1alpha1", "EnginePool")
POOL = yaml.safe_load((ROOT / "examples" / "enginepools" / "qwen3-8b.yaml").read_text())
BASE = {"hub": {"repo": "Qwen/Qwen3-0.6B"}}


@dataclass
class PoolServer:
    """The pool's server (the scripted engine) and the port its adapter store will listen on."""

    engine: Any
    store_port: int
    store_root: Path


@pytest.fixture
def pool_server(scripted_engine: Any, tmp_path: Path) -> PoolServer:
    return PoolServer(scripted_engine, free_port(), tmp_path / "adapters")


@pytest.fixture
def running(cluster: Any, learner_status: FakeLearnerStatus, pool_server: PoolServer) -> Iterator[tuple[Any, Context]]:  # noqa: F811 (the fixtures)
    """The emulator with the operator running on it, and the operator's context (its metrics)."""
    options = OperatorOptions(resync_seconds=0.3, learner_url_template=learner_status.url, request_timeout_s=5,
                              engine_pool_server_url_template=pool_server.engine.root_url,
                              engine_pool_store_url_template=f"http://127.0.0.1:{pool_server.store_port}")
    registry, ctx = build_registry(options, cluster.client())
    with cluster.kopf_runner(registry, namespace=NS):
        yield cluster, ctx


@pytest.fixture
def operator(running: tuple[Any, Context]) -> Any:
    return running[0]


@contextmanager
def adapter_store(pool_server: PoolServer, token: str) -> Iterator[str]:
    """The real adapter store app on the port the operator was told, taking the pool's token."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(create_app(pool_server.store_root, token), host="127.0.0.1",
                                           port=pool_server.store_port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{pool_server.store_port}"
    try:
        wait_until(lambda: server.started)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def wait_until(check: Any, timeout: float = 10) -> None:
    import time

    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def engine_pool(replicas: int = 1, **changes: Any) -> dict[str, Any]:
    spec = POOL["spec"] | {"model": {"base": BASE, "servedName": "qwen3"},
                           "engine": POOL["spec"]["engine"] | {"replicas": replicas}} | changes
    return {"apiVersion": EP[0], "kind": EP[1], "metadata": {"name": "shared", "namespace": NS}, "spec": spec}


def on_pool(name: str) -> dict[str, Any]:
    return small_run(name, engine={"pool": "shared"})


def pool_status(kube: Any) -> dict[str, Any]:
    return (kube.get(*EP, "shared", namespace=NS) or {}).get("status") or {}


def config_of(kube: Any, configmap: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(kube.get("v1", "ConfigMap", configmap, namespace=NS)["data"]["config.yaml"])
    return data


def test_two_runs_share_one_pool_and_follow_its_servers(operator: Any) -> None:
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
        # Each run's learner holds its own store credential (writes only its adapters), not the pool's token.
        own = operator.wait_for(lambda run=run: operator.get("v1", "Secret", f"{run}-adapter-store", namespace=NS),
                                timeout=15)
        pool_token = base64.b64decode(operator.get("v1", "Secret", "shared-enginepool-store", namespace=NS)["data"]["token"])
        assert base64.b64decode(own["data"]["token"]).decode() == run_credential(pool_token.decode(), run)
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


def test_a_run_moved_onto_a_pool_gives_up_its_own_engine(operator: Any) -> None:
    apply_pools(operator, "mini-swe-agent")
    operator.apply(engine_pool())
    operator.apply(small_run("run-a"))
    operator.wait_for(lambda: ("StatefulSet", "run-a-engine") in children(operator, "run-a"), timeout=15)
    operator.patch(*TR, "run-a", {"spec": {"engine": {"pool": "shared"}}}, namespace=NS)
    operator.wait_for(lambda: not {c for c in children(operator, "run-a") if c[1].startswith("run-a-engine")},
                      timeout=15)
    proxy = config_of(operator, "run-a-proxy-config")
    assert proxy["upstream_urls"] == ["http://shared-enginepool-0.shared-enginepool.default.svc:8000/"]


def test_a_run_waits_with_a_reason_until_its_pool_exists(operator: Any) -> None:
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


def test_the_adapters_of_a_deleted_run_are_unloaded_from_the_pool(operator: Any, pool_server: PoolServer,
                                                                   tmp_path: Path) -> None:
    apply_pools(operator, "mini-swe-agent")
    operator.apply(engine_pool())
    for run in ("run-a", "run-b"):
        operator.apply(on_pool(run))
    operator.wait_for(lambda: pool_status(operator).get("runs") == ["run-a", "run-b"], timeout=15)
    ready_workload(operator, "apps/v1", "StatefulSet", "shared-enginepool", 1)
    secret = operator.wait_for(lambda: operator.get("v1", "Secret", "shared-enginepool-store", namespace=NS), timeout=15)
    token = base64.b64decode(secret["data"]["token"]).decode()
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with adapter_store(pool_server, token) as store:
        # What the two learners did: upload each version to the store, then load it on the server.
        for name in ("run-a-v1", "run-a-v2", "run-b-v1"):
            stored = httpx.put(f"{store}/adapters/{name}", content=adapter_tar(adapter),
                               headers={"Authorization": f"Bearer {token}"}, timeout=10).raise_for_status().json()
            httpx.post(f"{pool_server.engine.root_url}/v1/load_lora_adapter", timeout=10,
                       json={"lora_name": name, "lora_path": stored["path"]}).raise_for_status()

        def served() -> set[str]:
            return {m["id"] for m in httpx.get(f"{pool_server.engine.base_url}/models", timeout=10).json()["data"]}

        operator.delete(*TR, "run-a", NS)
        wait_until(lambda: "run-a-v1" not in served() and "run-a-v2" not in served(), timeout=15)
        # run-b's adapter stays, on the server and in the store; run-a's are gone from both.
        assert "run-b-v1" in served()
        assert sorted(p.name for p in pool_server.store_root.iterdir()) == ["run-b-v1"]
        operator.wait_for(lambda: pool_status(operator).get("runs") == ["run-b"], timeout=15)


def test_a_pools_servers_gpu_time_is_the_pools_usage_not_its_runs(running: tuple[Any, Context]) -> None:
    """Chargeback of a shared engine: its servers' GPU-seconds are the pool's (status.usage and
    `harnessrl_enginepool_gpu_seconds` by namespace and pool); a run on the pool counts no engine GPU time."""
    kube, ctx = running
    apply_pools(kube, "mini-swe-agent")
    kube.apply(engine_pool())
    kube.apply(on_pool("run-a"))
    kube.wait_for(lambda: pool_status(kube).get("runs") == ["run-a"], timeout=15)
    started = (datetime.now(UTC) - timedelta(seconds=120)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.apply({"apiVersion": "v1", "kind": "Pod",  # the server Pod the StatefulSet controller would make
                "metadata": {"name": "shared-enginepool-0", "namespace": NS,
                             "labels": labels("shared", ComponentKind.ENGINE_POOL)},  # its template's
                "spec": {"containers": [{"name": "vllm", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}})
    kube.patch("v1", "Pod", "shared-enginepool-0", {"status": {"phase": "Running", "startTime": started}}, namespace=NS,
               subresource="status")
    seconds = kube.wait_for(lambda: (pool_status(kube).get("usage") or {}).get("gpuSeconds"), timeout=15)
    assert seconds >= 2 * 120
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(generate_latest(ctx.metrics.registry).decode()) for s in f.samples}
    assert samples[("harnessrl_enginepool_gpu_seconds_total", (("namespace", NS), ("pool", "shared")))] == seconds
    run_usage = (kube.get(*TR, "run-a", namespace=NS).get("status") or {}).get("usage") or {}
    assert "engine" not in run_usage.get("gpuSeconds", {})
