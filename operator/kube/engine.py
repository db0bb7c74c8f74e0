"""The vLLM engine: a StatefulSet (stable per-replica DNS, the learner loads weights into each replica)
behind a headless Service. With LoRA sync each Pod also runs the adapter store, a sidecar the learner uploads
adapters to, on a volume vLLM loads them from (runtime/engine/adapter_store.py). A run's own engine, or an
EnginePool's servers (`pool_manifests`, with the NetworkPolicy that admits the runs on the pool). Pure."""

from __future__ import annotations

from harnessrl.operator.api.common import ENGINE_POOL_LABEL
from harnessrl.operator.api.trainingrun import BaseModelSource
from harnessrl.operator.kube.common import (
    COMPONENT,
    READ_ONLY_ROOT,
    Manifest,
    Owner,
    Scope,
    component_metadata,
    config_hash,
    config_map,
    container_ports,
    env_list,
    http_probe,
    pod_template,
    resources,
    running_replicas,
    secret_file,
    selector,
    service,
    token_secret,
    volumes_and_mounts,
    writable_scratch,
)
from harnessrl.operator.kube.network import DEFAULT_OPERATOR_NAMESPACE, operator_peer
from harnessrl.operator.kube.storage import engine_model
from harnessrl.operator.plan.names import (
    engine_pool_api_key_secret,
    engine_pool_store_secret,
    run_store_secret,
)
from harnessrl.operator.plan.types import AdapterStorePlan, Component, ComponentKind, EnginePoolPlan, Plan
from harnessrl.runtime.contracts.engine_config import EngineConfig
from harnessrl.runtime.contracts.engine_launch import engine_command
from harnessrl.runtime.contracts.store_credentials import run_credential

SHM_SIZE = "16Gi"  # NCCL and vLLM's multi-process workers exchange tensors through /dev/shm
ADAPTER_DIR = "/var/lib/harnessrl/adapters"  # the same path in both containers: the store answers with it


def manifests(plan: Plan, owner: Owner) -> list[Manifest]:
    """The run's own engine; none on an EnginePool."""
    if plan.engine is None:
        return []
    return servers(plan, owner, plan.engine, plan.adapter_store, plan.spec.model.base)


def pool_manifests(
    pool: EnginePoolPlan, owner: Owner, operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE
) -> list[Manifest]:
    """An EnginePool's servers, and the NetworkPolicy that lets only its runs' proxies and learners reach them (and
the operator, which unloads the adapters of runs that are gone: handlers/adapters.py)."""
    runs = [{"podSelector": {"matchLabels": {ENGINE_POOL_LABEL: pool.pool, COMPONENT: str(kind)}}}
            for kind in (ComponentKind.PROXY, ComponentKind.LEARNER)]
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": component_metadata(pool, owner, pool.engine),
        "spec": {
            "podSelector": {"matchLabels": selector(pool.pool, pool.engine.kind)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [*runs, operator_peer(operator_namespace)]}],
        },
    }
    return [*servers(pool, owner, pool.engine, pool.adapter_store, pool.spec.model.base), policy]


def store_secret(pool: EnginePoolPlan, owner: Owner, token: str) -> Manifest:
    """The token of an EnginePool's adapter stores (generated once): its runs' learners upload with it."""
    return token_secret(pool, owner, engine_pool_store_secret(pool.pool), ComponentKind.ENGINE_POOL, token)


def api_key_secret(pool: EnginePoolPlan, owner: Owner, key: str) -> Manifest:
    """The API key an EnginePool's vLLM servers require (generated once): only its servers, the operator and its
    runs' proxies and learners hold it."""
    return token_secret(pool, owner, engine_pool_api_key_secret(pool.pool), ComponentKind.ENGINE_POOL, key)


def run_store_credential(plan: Plan, owner: Owner, pool_token: str) -> Manifest:
    """A run's own credential at its EnginePool's adapter stores, from the pool's token (which stays with the pool
    and the operator): it writes and deletes only the run's adapters."""
    return token_secret(plan, owner, run_store_secret(plan.run), ComponentKind.LEARNER, run_credential(pool_token, plan.run))


def servers(
    scope: Scope, owner: Owner, engine: Component, store: AdapterStorePlan | None, base: BaseModelSource
) -> list[Manifest]:
    assert isinstance(engine.config, EngineConfig)
    launch = engine_command(engine.config, python="python3")
    volumes, mounts = volumes_and_mounts(engine)
    model_volumes, model_mounts = engine_model(base)
    scratch_volumes, scratch_mounts, home = writable_scratch()
    volumes += [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}, *scratch_volumes,
                *model_volumes]
    mounts += [{"name": "shm", "mountPath": "/dev/shm"}, *scratch_mounts, *model_mounts]
    container = {
        "name": "vllm",
        "image": engine.image,
        "command": launch.argv,
        "env": env_list(launch.env | home) + secret_env(engine),
        "ports": container_ports(engine),
        "resources": resources(engine),
        "volumeMounts": mounts,
        # Loading weights (and downloading them from the Hub) can take long: up to 60 min before liveness applies.
        "startupProbe": http_probe("/health", period=10, failures=360),
        "readinessProbe": http_probe("/health", period=10, failures=3),
        "livenessProbe": http_probe("/health", period=20, failures=6),
        # vLLM writes only its caches (HOME), /tmp and /dev/shm.
        "securityContext": READ_ONLY_ROOT,
    }
    spec: Manifest = {"containers": [container], "volumes": volumes, "automountServiceAccountToken": False}
    if store is not None:
        token_volume, token_mount = secret_file("adapter-store-token", store.token)
        mounts.append({"name": "adapters", "mountPath": ADAPTER_DIR, "readOnly": True})
        volumes += [{"name": "adapters", "emptyDir": {}}, token_volume]
        spec["containers"].append(adapter_store_container(store, token_mount))
    pod = pod_template(scope, engine, spec, config_digest=config_hash(launch.model_dump()))
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": component_metadata(scope, owner, engine),
        "spec": {
            "serviceName": engine.name,
            "replicas": running_replicas(scope, engine),
            # Replicas are independent servers: start them all at once.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector(scope.scope_name, engine.kind)},
            "template": pod,
        },
    }
    return [config_map(scope, owner, engine), service(scope, owner, engine, engine.name, headless=True), statefulset]


def secret_env(engine: Component) -> list[Manifest]:
    """The variables whose values are Secrets, as references the kubelet resolves (never the values)."""
    assert isinstance(engine.config, EngineConfig)
    files = {f.path: f for f in engine.secrets}
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": files[path].secret, "key": files[path].key}}}
            for name, path in engine.config.secret_env.items()]


def adapter_store_container(store: AdapterStorePlan, token_mount: Manifest) -> Manifest:
    probe = {"httpGet": {"path": "/healthz", "port": "adapters"}, "periodSeconds": 10, "failureThreshold": 3}
    return {
        "name": "adapter-store",
        "image": store.image,
        "command": ["harnessrl", "adapter-store", "--dir", ADAPTER_DIR, "--token-file", store.token.path,
                    "--port", str(store.port)],
        "ports": [{"name": "adapters", "containerPort": store.port, "protocol": "TCP"}],
        "volumeMounts": [{"name": "adapters", "mountPath": ADAPTER_DIR}, token_mount],
        "readinessProbe": probe,
        # Uploads stream to the adapters volume: memory holds one chunk at a time.
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": READ_ONLY_ROOT,
    }
