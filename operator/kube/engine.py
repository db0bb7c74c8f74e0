"""The vLLM engine: a StatefulSet (stable per-replica DNS, the learner loads weights into each replica)
behind a headless Service. With LoRA sync each Pod also runs the adapter store, a sidecar the learner uploads
adapters to, on a volume vLLM loads them from (runtime/engine/adapter_store.py). Pure."""

from __future__ import annotations

from harnessrl.operator.kube.common import (
    READ_ONLY_ROOT,
    Manifest,
    Owner,
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
    volumes_and_mounts,
)
from harnessrl.operator.kube.storage import engine_model
from harnessrl.operator.plan import AdapterStorePlan, Plan
from harnessrl.runtime.engine.config import EngineConfig
from harnessrl.runtime.engine.launch import engine_command

SHM_SIZE = "16Gi"  # NCCL and vLLM's multi-process workers exchange tensors through /dev/shm
ADAPTER_DIR = "/var/lib/harnessrl/adapters"  # the same path in both containers: the store answers with it
# vLLM runs as RUN_AS, not as its image's root: its caches (Hugging Face, vLLM, Triton) go under this HOME.
HOME = "/var/lib/harnessrl/home"


def manifests(plan: Plan, owner: Owner) -> list[Manifest]:
    engine = plan.engine
    assert isinstance(engine.config, EngineConfig)
    launch = engine_command(engine.config, python="python3")
    volumes, mounts = volumes_and_mounts(engine)
    model_volumes, model_mounts = engine_model(plan)
    volumes += [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}, {"name": "home", "emptyDir": {}},
                *model_volumes]
    mounts += [{"name": "shm", "mountPath": "/dev/shm"}, {"name": "home", "mountPath": HOME}, *model_mounts]
    container = {
        "name": "vllm",
        "image": engine.image,
        "command": launch.argv,
        "env": env_list(launch.env | {"HOME": HOME}),
        "ports": container_ports(engine),
        "resources": resources(engine),
        "volumeMounts": mounts,
        # Loading weights (and downloading them from the Hub) can take long: up to 60 min before liveness applies.
        "startupProbe": http_probe("/health", period=10, failures=360),
        "readinessProbe": http_probe("/health", period=10, failures=3),
        "livenessProbe": http_probe("/health", period=20, failures=6),
    }
    spec: Manifest = {"containers": [container], "volumes": volumes, "automountServiceAccountToken": False}
    if plan.adapter_store is not None:
        token_volume, token_mount = secret_file("adapter-store-token", plan.adapter_store.token)
        mounts.append({"name": "adapters", "mountPath": ADAPTER_DIR, "readOnly": True})
        volumes += [{"name": "adapters", "emptyDir": {}}, token_volume]
        spec["containers"].append(adapter_store_container(plan.adapter_store, token_mount))
    pod = pod_template(plan, engine, spec, config_digest=config_hash(launch.model_dump()))
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": component_metadata(plan, owner, engine),
        "spec": {
            "serviceName": engine.name,
            "replicas": running_replicas(plan, engine),
            # Replicas are independent servers: start them all at once.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector(plan.run, engine.kind)},
            "template": pod,
        },
    }
    return [config_map(plan, owner, engine), service(plan, owner, engine, engine.name, headless=True), statefulset]


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
        # An upload is held in memory while it is unpacked: room for a few hundred MB of adapter.
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": READ_ONLY_ROOT,
    }
