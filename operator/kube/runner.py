"""The runners of one HarnessPool: a Deployment, its ServiceAccount, and only the RBAC its sandbox needs
(the kubernetes sandbox creates, execs into and deletes one Pod and one NetworkPolicy per rollout). Pure.

The sandbox rules live in one ClusterRole the chart installs (SANDBOX_CLUSTER_ROLE); a kubernetes-sandbox
pool's runners get it through a RoleBinding in their namespace. The operator holds `bind` on that ClusterRole
only, never the rules themselves: it cannot create Pods or exec into them."""

from __future__ import annotations

import yaml
from harnessrl.operator.kube.common import (
    POD_PLACEHOLDER,
    READ_ONLY_ROOT,
    Manifest,
    Owner,
    component_metadata,
    config_hash,
    config_map,
    container_ports,
    env_list,
    metadata,
    per_pod_start,
    pod_env,
    pod_template,
    resources,
    running_replicas,
    selector,
    volumes_and_mounts,
    writable_scratch,
)
from harnessrl.operator.kube.storage import task_set
from harnessrl.operator.plan.types import Component, Plan
from harnessrl.runtime.contracts.runner_config import KubernetesSandboxConfig, RunnerConfig

# What a kubernetes-sandbox runner does in its namespace, and nothing more.
SANDBOX_CLUSTER_ROLE = "harnessrl-sandbox"  # cluster-scoped like the CRDs: one per cluster, from the chart
SANDBOX_RULES: list[Manifest] = [  # what the chart's ClusterRole holds (tests/unit/test_chart_harnessrl.py)
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete", "get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create", "delete", "get", "list"]},
]


def needs_kube_access(runner: Component) -> bool:
    assert isinstance(runner.config, RunnerConfig)
    return isinstance(runner.config.sandbox, KubernetesSandboxConfig)


def runner_config(runner: Component) -> str:
    """The rendered RunnerConfig; each replica leases under its own Pod name."""
    data = runner.config_json()
    data["runner_id"] = POD_PLACEHOLDER
    return yaml.safe_dump(data, sort_keys=True)


def manifests(plan: Plan, owner: Owner, runner: Component) -> list[Manifest]:
    config = runner_config(runner)
    kube_access = needs_kube_access(runner)
    volumes, mounts = volumes_and_mounts(runner)
    task_volumes, task_mounts, task_inits = task_set(plan, runner.image)
    scratch_volumes, scratch_mounts, home = writable_scratch()
    container = {
        "name": "runner",
        "image": runner.image,
        "command": per_pod_start("runner"),
        "env": [*pod_env(), *env_list(home)],
        "resources": resources(runner),
        "volumeMounts": [*mounts, *task_mounts, *scratch_mounts],
        # It writes its config copy and rollouts under /tmp and downloads under HOME.
        "securityContext": READ_ONLY_ROOT,
    }
    if runner.ports:  # its /metrics
        container["ports"] = container_ports(runner)
    spec = {
        "initContainers": task_inits,
        "containers": [container],
        "volumes": [*volumes, *task_volumes, *scratch_volumes],
        # Only a kubernetes sandbox talks to the API server; other runners get no token at all.
        "automountServiceAccountToken": kube_access,
    }
    pod = pod_template(plan, runner, spec, config_digest=config_hash(config), service_account=runner.name)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": component_metadata(plan, owner, runner),
        "spec": {
            "replicas": running_replicas(plan, runner),
            "selector": {"matchLabels": selector(plan.run, runner.kind, runner.pool)},
            "template": pod,
        },
    }
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(plan, owner, runner.name, runner.kind, runner.pool),
        "automountServiceAccountToken": kube_access,
    }
    out = [config_map(plan, owner, runner, config), account]
    if kube_access:
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata(plan, owner, runner.name, runner.kind, runner.pool),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SANDBOX_CLUSTER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": runner.name, "namespace": plan.namespace}],
        }
        out.append(binding)
    return [*out, deployment]
