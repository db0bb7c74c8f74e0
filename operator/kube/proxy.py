"""The capture proxy: a StatefulSet (each replica owns its sessions and journal, at a stable DNS name), a
headless Service for those names, a Service for any-replica access, and its admin-token Secret. Pure."""

from __future__ import annotations

import yaml
from harnessrl.operator.kube.common import (
    POD_PLACEHOLDER,
    READ_ONLY_ROOT,
    TMP_MOUNT,
    TMP_VOLUME,
    Manifest,
    Owner,
    component_metadata,
    config_hash,
    config_map,
    container_ports,
    http_probe,
    per_pod_start,
    pod_env,
    pod_template,
    resources,
    running_replicas,
    selector,
    service,
    token_secret,
    volumes_and_mounts,
)
from harnessrl.operator.plan.names import proxy_headless_name
from harnessrl.operator.plan.placement import CLUSTER_PATHS, ClusterPlacement
from harnessrl.operator.plan.types import Plan

JOURNAL_SIZE = "10Gi"


def headless_name(plan: Plan) -> str:
    return proxy_headless_name(plan.run)


def proxy_config(plan: Plan) -> str:
    """The rendered ProxyConfig, with each replica's identity and public URL left as placeholders."""
    data = plan.proxy.config_json()
    data["replica_id"] = POD_PLACEHOLDER
    data["public_base_url"] = ClusterPlacement(plan.namespace).proxy_replica_url(plan.run, POD_PLACEHOLDER)
    return yaml.safe_dump(data, sort_keys=True)


def admin_secret(plan: Plan, owner: Owner, token: str) -> Manifest:
    """The proxy's admin token: generated once by the operator, read by proxy, learner and runners as a file."""
    return token_secret(plan, owner, plan.proxy_admin_secret, plan.proxy.kind, token)


def manifests(plan: Plan, owner: Owner) -> list[Manifest]:
    proxy = plan.proxy
    config = proxy_config(plan)
    volumes, mounts = volumes_and_mounts(proxy)
    mounts += [{"name": "journal", "mountPath": CLUSTER_PATHS["journal"]}, TMP_MOUNT]
    container = {
        "name": "proxy",
        "image": proxy.image,
        "command": per_pod_start("proxy"),
        "env": pod_env(),
        "ports": container_ports(proxy),
        "resources": resources(proxy),
        "volumeMounts": mounts,
        "readinessProbe": http_probe("/healthz", period=5, failures=3),
        "livenessProbe": http_probe("/healthz", period=20, failures=3, initial_delay=10),
        "securityContext": READ_ONLY_ROOT,
    }
    pod = pod_template(
        plan,
        proxy,
        {
            "containers": [container],
            "volumes": [*volumes, TMP_VOLUME],
            "automountServiceAccountToken": False,
        },
        config_digest=config_hash(config),
    )
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": component_metadata(plan, owner, proxy),
        "spec": {
            "serviceName": headless_name(plan),
            "replicas": running_replicas(plan, proxy),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector(plan.run, proxy.kind)},
            "template": pod,
            # The journals go with the StatefulSet (so with the run): a new run of the same name must not replay
            # them. Scaled to zero (suspended, finished) they stay.
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "journal"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": JOURNAL_SIZE}}},
                }
            ],
        },
    }
    return [
        config_map(plan, owner, proxy, config),
        # Per-replica DNS must exist before readiness: a harness is sent to its session's replica by name.
        service(plan, owner, proxy, headless_name(plan), headless=True, metrics=False, publish_not_ready=True),
        service(plan, owner, proxy, proxy.name),
        statefulset,
    ]
