"""The vLLM engine: a StatefulSet (stable per-replica DNS, the learner loads weights into each replica)
behind a headless Service. Pure."""

from __future__ import annotations

from harnessrl.operator.kube.common import (
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
    selector,
    service,
    volumes_and_mounts,
)
from harnessrl.operator.kube.storage import engine_model
from harnessrl.operator.plan import Plan
from harnessrl.runtime.engine.config import EngineConfig
from harnessrl.runtime.engine.launch import engine_command

SHM_SIZE = "16Gi"  # NCCL and vLLM's multi-process workers exchange tensors through /dev/shm


def manifests(plan: Plan, owner: Owner) -> list[Manifest]:
    engine = plan.engine
    assert isinstance(engine.config, EngineConfig)
    launch = engine_command(engine.config, python="python3")
    volumes, mounts = volumes_and_mounts(engine)
    model_volumes, model_mounts = engine_model(plan)
    volumes += [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}, *model_volumes]
    mounts += [{"name": "shm", "mountPath": "/dev/shm"}, *model_mounts]
    container = {
        "name": "vllm",
        "image": engine.image,
        "command": launch.argv,
        "env": env_list(launch.env),
        "ports": container_ports(engine),
        "resources": resources(engine),
        "volumeMounts": mounts,
        # Loading weights (and downloading them from the Hub) can take long: up to 60 min before liveness applies.
        "startupProbe": http_probe("/health", period=10, failures=360),
        "readinessProbe": http_probe("/health", period=10, failures=3),
        "livenessProbe": http_probe("/health", period=20, failures=6),
    }
    spec = {"containers": [container], "volumes": volumes, "automountServiceAccountToken": False}
    pod = pod_template(plan, engine, spec, config_digest=config_hash(launch.model_dump()))
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": component_metadata(plan, owner, engine),
        "spec": {
            "serviceName": engine.name,
            "replicas": engine.replicas,
            # Replicas are independent servers: start them all at once.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector(plan.run, engine.kind)},
            "template": pod,
        },
    }
    return [config_map(plan, owner, engine), service(plan, owner, engine, engine.name, headless=True), statefulset]
