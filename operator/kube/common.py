"""Pieces every manifest shares: labels, ownerReferences, pod overrides, config and secret volumes. Pure."""

from __future__ import annotations

import base64
import hashlib
import json
import posixpath
from typing import Any, Protocol

import yaml
from harnessrl.operator.api.common import (
    API_VERSION,
    COMPONENT_LABEL,
    ENGINE_POOL_LABEL,
    POOL_LABEL,
    RUN_LABEL,
    PodOverrides,
)
from harnessrl.operator.api.trainingrun import KIND as TRAININGRUN_KIND
from harnessrl.operator.plan.types import Component, ComponentKind, SecretFile
from harnessrl.runtime.contracts.kubernetes import RESTRICTED_CONTAINER, restricted_pod
from pydantic import BaseModel, ConfigDict

Manifest = dict[str, Any]

NAME = "harnessrl"
MANAGED_BY = "harnessrl-operator"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"  # on every child: what the operator's watches select
# Selectors use only the operator's own labels (see api/common.py); app.kubernetes.io/* are informative, and
# app.kubernetes.io/instance is left to Helm and Argo CD, which track their applications by it.
RUN = RUN_LABEL
COMPONENT = COMPONENT_LABEL
POOL = POOL_LABEL
APP_COMPONENT = "app.kubernetes.io/component"
METRICS = "harnessrl.io/metrics"  # Services with /metrics on their `http` port (the chart's ServiceMonitor)
CONFIG_HASH = "harnessrl.io/config-hash"
# On a Job or JobSet: a digest of its Pod template but the scheduling directives (which a suspended Job may change):
# a live one with another digest cannot take the change and is replaced (control/apply.py replacement_reason).
TEMPLATE_HASH = "harnessrl.io/template-hash"
SCHEDULING_DIRECTIVES = ("nodeSelector", "tolerations", "affinity", "schedulingGates")
CONFIG_DIR = "/etc/harnessrl"
# The harnessrl images' user. Every Pod runs as it, whatever the image's USER (vLLM's image is root), and as
# fsGroup it reads the Secret files (mode 0440) and owns the volumes.
RUN_AS = 10001
# Pod Security "restricted" (a namespace enforcing it accepts every Pod the operator creates), as sandboxes have it.
POD_SECURITY: Manifest = restricted_pod(RUN_AS)
CONTAINER_SECURITY: Manifest = RESTRICTED_CONTAINER
# Servers that write only to their volumes run on a read-only root; /tmp is an emptyDir for them.
READ_ONLY_ROOT: Manifest = {"readOnlyRootFilesystem": True}
TMP_VOLUME: Manifest = {"name": "tmp", "emptyDir": {}}
TMP_MOUNT: Manifest = {"name": "tmp", "mountPath": "/tmp"}
# Their caches (Hugging Face, vLLM, Triton, torch) go under this HOME, an emptyDir: they run as RUN_AS, whatever
# the image's USER and its home.
HOME = "/var/lib/harnessrl/home"
HOME_VOLUME: Manifest = {"name": "home", "emptyDir": {}}
HOME_MOUNT: Manifest = {"name": "home", "mountPath": HOME}


def writable_scratch() -> tuple[list[Manifest], list[Manifest], dict[str, str]]:
    """(volumes, mounts, environment) of a program on a read-only root: /tmp and HOME are emptyDirs."""
    return [TMP_VOLUME, HOME_VOLUME], [TMP_MOUNT, HOME_MOUNT], {"HOME": HOME}
# A ConfigMap is shared by all replicas; a replica that needs its own identity fills in its Pod name at start.
POD_PLACEHOLDER = "__POD_NAME__"


class Scope(Protocol):
    """What children belong to, for their namespace, names and labels: a run's Plan, or an EnginePoolPlan."""

    @property
    def scope_name(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def suspended(self) -> bool: ...


class Owner(BaseModel):
    """The TrainingRun (or EnginePool) every child belongs to: deleting it deletes them (garbage collection, no
    finalizer)."""

    model_config = ConfigDict(frozen=True)

    name: str
    uid: str
    kind: str = TRAININGRUN_KIND

    def reference(self) -> Manifest:
        return {
            "apiVersion": API_VERSION,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def selector(run: str, component: str, pool: str | None = None) -> dict[str, str]:
    """The labels that select one component's Pods (stable: selectors of StatefulSets are immutable). `run` is
    the owner's name: an EnginePool's servers are selected by the pool's label, not a run's."""
    owner = ENGINE_POOL_LABEL if component == ComponentKind.ENGINE_POOL else RUN
    return {owner: run, COMPONENT: str(component)} | ({POOL: pool} if pool else {})


def labels(run: str, component: str, pool: str | None = None) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": NAME,
        APP_COMPONENT: str(component),
        "app.kubernetes.io/part-of": NAME,
        MANAGED_BY_LABEL: MANAGED_BY,
        **selector(run, component, pool),
    }


def metadata(scope: Scope, owner: Owner, name: str, component: str, pool: str | None = None, **extra_labels: str) -> Manifest:
    return {
        "name": name,
        "namespace": scope.namespace,
        "labels": labels(scope.scope_name, component, pool) | extra_labels,
        "ownerReferences": [owner.reference()],
    }


def token_secret(scope: Scope, owner: Owner, name: str, component: str, token: str) -> Manifest:
    """A generated bearer token the operator creates once and keeps, mounted as a file where it is needed."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(scope, owner, name, component),
        "type": "Opaque",
        "data": {"token": base64.b64encode(token.encode()).decode()},
    }


def component_metadata(scope: Scope, owner: Owner, component: Component, name: str | None = None) -> Manifest:
    return metadata(scope, owner, name or component.name, component.kind, component.pool)


def running_replicas(scope: Scope, component: Component) -> int:
    """A suspended run's workloads (or one Kueue has not admitted) keep their Pod templates at zero replicas."""
    return 0 if scope.suspended else component.replicas


def config_map_name(component: Component) -> str:
    return f"{component.name}-config"


def rendered_config(component: Component) -> str:
    return yaml.safe_dump(component.config_json(), sort_keys=True)


def config_map(scope: Scope, owner: Owner, component: Component, config: str | None = None) -> Manifest:
    """The component's rendered config; `config` overrides the plain rendering (e.g. with placeholders)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(scope, owner, config_map_name(component), component.kind, component.pool),
        "data": {"config.yaml": config if config is not None else rendered_config(component)},
    }


def template_hash(template: Manifest) -> str:
    fixed = {k: v for k, v in template["spec"].items() if k not in SCHEDULING_DIRECTIVES}
    return config_hash(template["metadata"], fixed)


def config_hash(*parts: Any) -> str:
    """A digest of what a Pod reads at start: a change rolls the Pods."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def volumes_and_mounts(component: Component) -> tuple[list[Manifest], list[Manifest]]:
    """The config file and every Secret file the component reads, as volumes and read-only mounts."""
    volumes: list[Manifest] = [{"name": "config", "configMap": {"name": config_map_name(component)}}]
    mounts: list[Manifest] = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
    for index, secret in enumerate(component.secrets):
        volume, mount = secret_file(f"secret-{index}", secret)
        volumes.append(volume)
        mounts.append(mount)
    return volumes, mounts


def secret_mounts(component: Component, path: str) -> list[Manifest]:
    """For another container of the component's Pod (an init container): the mount of the component's Secret
    file at `path` (a volume volumes_and_mounts made); none when the component has no such file."""
    return [secret_file(f"secret-{i}", s)[1] for i, s in enumerate(component.secrets) if s.path == path]


def secret_file(name: str, secret: SecretFile) -> tuple[Manifest, Manifest]:
    """A volume with one Secret key, and its read-only mount that puts the key at `secret.path`."""
    items = [{"key": secret.key, "path": posixpath.basename(secret.path)}]
    volume = {"name": name, "secret": {"secretName": secret.secret, "items": items, "defaultMode": 0o440}}
    return volume, {"name": name, "mountPath": posixpath.dirname(secret.path), "readOnly": True}


def resources(component: Component) -> Manifest:
    """Requests and limits; GPUs go in both (extended resources must have requests == limits)."""
    requests = {k: str(v) for k, v in component.resources.requests.items()}
    limits = {k: str(v) for k, v in component.resources.limits.items()}
    if component.gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(component.gpus)
    return {k: v for k, v in {"requests": requests, "limits": limits}.items() if v}


def pod_env() -> list[Manifest]:
    """Who the Pod is, for components that need a per-replica identity."""
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]


def env_list(env: dict[str, str]) -> list[Manifest]:
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def pod_template(
    scope: Scope,
    component: Component,
    spec: Manifest,
    *,
    config_digest: str,
    service_account: str | None = None,
) -> Manifest:
    """A Pod template under Pod Security `restricted`, with the run's pod overrides applied (scheduling,
    labels, annotations, account)."""
    pod: PodOverrides = component.pod
    # The operator's labels win over the user's: its selectors (immutable on a StatefulSet) and its
    # watches find Pods by them.
    template_labels = dict(pod.labels) | labels(scope.scope_name, component.kind, component.pool)
    spec = restricted(spec)
    if pod.node_selector:
        spec["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        spec["tolerations"] = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in pod.tolerations]
    if pod.affinity:
        spec["affinity"] = pod.affinity
    if pod.priority_class_name:
        spec["priorityClassName"] = pod.priority_class_name
    account = pod.service_account_name or service_account
    if account:
        spec["serviceAccountName"] = account
    return {
        "metadata": {
            "labels": template_labels,
            "annotations": dict(pod.annotations) | {CONFIG_HASH: config_digest},
        },
        "spec": spec,
    }


def restricted(spec: Manifest) -> Manifest:
    """The pod spec with the restricted profile's settings on the Pod and every container; a container's own
    securityContext (e.g. READ_ONLY_ROOT) is kept."""
    spec = dict(spec)
    spec["securityContext"] = dict(POD_SECURITY)
    for field in ("initContainers", "containers"):
        if field in spec:
            spec[field] = [c | {"securityContext": CONTAINER_SECURITY | c.get("securityContext", {})} for c in spec[field]]
    return spec


def http_probe(path: str, *, period: int, failures: int, initial_delay: int = 0) -> Manifest:
    probe: Manifest = {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }
    if initial_delay:
        probe["initialDelaySeconds"] = initial_delay
    return probe


def service(
    scope: Scope,
    owner: Owner,
    component: Component,
    name: str,
    *,
    headless: bool = False,
    metrics: bool = True,
    publish_not_ready: bool = False,
) -> Manifest:
    meta = metadata(scope, owner, name, component.kind, component.pool)
    if metrics:
        meta["labels"][METRICS] = "true"
    spec: Manifest = {
        "selector": selector(scope.scope_name, component.kind, component.pool),
        "ports": [{"name": p.name, "port": p.port, "targetPort": p.name, "protocol": "TCP"} for p in component.ports],
    }
    if headless:
        spec["clusterIP"] = "None"
    if publish_not_ready:
        spec["publishNotReadyAddresses"] = True
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def container_ports(component: Component) -> list[Manifest]:
    return [{"name": p.name, "containerPort": p.port, "protocol": "TCP"} for p in component.ports]


def per_pod_start(subcommand: str) -> list[str]:
    """Start `harnessrl SUBCOMMAND` on the mounted config with POD_PLACEHOLDER replaced by the Pod's name."""
    local = f"/tmp/harnessrl-{subcommand}.yaml"
    script = (
        f'sed "s/{POD_PLACEHOLDER}/$POD_NAME/g" {CONFIG_DIR}/config.yaml > {local}'
        f" && exec harnessrl {subcommand} --config {local}"
    )
    return ["sh", "-c", script]
