"""The Helm chart renders (helm-python-sdk: Helm's Go SDK, no helm binary) with default and namespaced values,
lints clean, its rendered manifests pass `kubernetes-validate --strict`, and its crds/ equal the repo's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from tests.kube_emulator import pod_security

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "harnessrl"
K8S_VERSION = "1.31"
# Custom kinds kubernetes-validate has no schema for (it validates built-in kinds offline).
CUSTOM_KINDS = {"ServiceMonitor", "PodMonitor"}  # prometheus-operator kinds: no Kubernetes schema

VALUES: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": {"watch": {"clusterWide": False, "namespaces": ["team-a", "team-b"]}},
    "release-namespace-only": {"watch": {"clusterWide": False, "namespaces": []}, "serviceMonitor": {"enabled": True}},
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        rendered = chart.render(values, name="harnessrl", namespace="harnessrl-system")
    docs = []
    for path, text in rendered.items():
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


@pytest.mark.parametrize("case", sorted(VALUES))
def test_chart_renders_valid_manifests(case: str) -> None:
    docs = render(VALUES[case])
    kinds = {(d["kind"], d["metadata"].get("namespace")) for d in docs}
    for doc in docs:
        if doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    # Two replicas, one reconciling: the Lease holder (operator/control/leader.py); a rolling update hands it over.
    assert deployment["spec"]["replicas"] == 2 and deployment["spec"]["strategy"] == {"type": "RollingUpdate"}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"] and "--standalone" in container["args"]
    assert {"--leader-elect", "--lease-name=harnessrl", "--metrics-port=9090", "--log-format=json"} <= set(container["args"])
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    lease_roles = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "harnessrl-leader-election"]
    assert [(r["metadata"]["namespace"], r["rules"]) for r in lease_roles] == [
        ("harnessrl-system", [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}])]
    # Runs' NetworkPolicies let the operator reach their learners by this label.
    assert deployment["spec"]["template"]["metadata"]["labels"]["harnessrl.io/component"] == "operator"
    # The operator runs under Pod Security "restricted", as every Pod it creates does.
    assert pod_security.violations("restricted", deployment["spec"]["template"]["spec"]) == []
    roles = [d for d in docs if d["kind"] in ("Role", "RoleBinding") and d["metadata"]["name"] == "harnessrl"]
    if case == "default":
        assert ("ClusterRoleBinding", None) in kinds and "--all-namespaces" in container["args"]
        assert not roles
    else:
        namespaces = VALUES[case]["watch"]["namespaces"] or ["harnessrl-system"]
        assert {d["metadata"]["namespace"] for d in roles} == set(namespaces)
        assert [a for a in container["args"] if a.startswith("--namespace=")] == [f"--namespace={n}" for n in namespaces]
        # Only discovery is cluster-wide in namespaced mode.
        cluster_roles = [d for d in docs if d["kind"] == "ClusterRole"]
        assert sorted(r["metadata"]["name"] for r in cluster_roles) == ["harnessrl-discovery", "harnessrl-sandbox"]
    assert any(d["kind"] == "ServiceMonitor" for d in docs) == (case == "release-namespace-only")
    monitors = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "PodMonitor")
    assert monitors == (["harnessrl-operator", "harnessrl-runners"] if case == "release-namespace-only" else [])


def grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@pytest.mark.parametrize("case", sorted(VALUES))
def test_operator_binds_the_sandbox_role_without_holding_its_rights(case: str) -> None:
    """Runners get the sandbox rules through the chart's ClusterRole, which the operator may bind (by name) but
    not use: it creates no Pods, never execs, and reads Secrets only by name."""
    from harnessrl.operator.kube.runner import SANDBOX_CLUSTER_ROLE, SANDBOX_RULES

    docs = render(VALUES[case])
    sandbox = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == SANDBOX_CLUSTER_ROLE)
    assert sandbox["rules"] == SANDBOX_RULES
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole") and d["metadata"]["name"] == "harnessrl"]
    assert roles
    for role in roles:
        held = grants(role)
        assert not {("", "pods", "create"), ("", "pods/exec", "create"), ("", "pods", "delete")} & held
        assert not {("", "secrets", "list"), ("", "secrets", "watch")} & held
        assert not any(r == "roles" for _, r, _ in held)
        bind = [rule for rule in role["rules"] if "bind" in rule["verbs"]]
        assert bind == [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"],
                         "resourceNames": [SANDBOX_CLUSTER_ROLE]}]


@pytest.mark.parametrize("case", sorted(VALUES))
def test_operator_may_block_owner_deletion_of_what_it_owns(case: str) -> None:
    """OwnerReferencesPermissionEnforcement (OpenShift): an ownerReference with blockOwnerDeletion is accepted
    only from a subject that may update the owner's finalizers and delete the owner. Every child the operator
    renders carries such a reference, so each Role/ClusterRole it runs under must hold both for each owner kind."""
    from harnessrl.operator.api.common import GROUP
    from harnessrl.operator.control.apply import PLURALS

    from tests.unit.test_operator_manifests import VARIANTS, manifests

    owners = set()
    for variant in VARIANTS.values():
        for manifest in manifests(**variant).values():
            for ref in manifest["metadata"].get("ownerReferences", []):
                assert ref["controller"] is True and ref["blockOwnerDeletion"] is True
                owners.add(PLURALS[(ref["apiVersion"], ref["kind"])])
    assert owners == {"trainingruns"}
    docs = render(VALUES[case])
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole") and d["metadata"]["name"] == "harnessrl"]
    assert roles
    for role in roles:
        for plural in owners:
            assert {(GROUP, f"{plural}/finalizers", "update"), (GROUP, plural, "delete")} <= grants(role), role["metadata"]


@pytest.mark.parametrize("case", sorted(VALUES))
def test_chart_lints_clean(case: str) -> None:
    report = helm.lint(CHART, VALUES[case], strict=True, namespace="harnessrl-system")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_values_schema_rejects_bad_values() -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"watch": {"clusterWide": "yes"}})


def test_chart_crds_are_the_generated_crds() -> None:
    repo = {p.name: p.read_text() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    assert repo and chart == repo, "copy crds/*.yaml into charts/harnessrl/crds/"
