"""The emulator's RBAC decisions (tests/kube_emulator/authz.py) against the rules of Kubernetes' RBAC
authorizer and owner-reference admission, case by case. Pure: no server."""

from __future__ import annotations

from typing import Any

from tests.kube_emulator.authz import (
    ADMIN,
    Attributes,
    allowed,
    escalation_message,
    missing_rights,
    owner_reference_refusals,
    rule_allows,
    service_account,
)

OPERATOR = service_account("ops", "operator")
RBAC = "rbac.authorization.k8s.io"


def binding(kind: str, role_kind: str, role: str, namespace: str | None = None,
            subject: dict[str, str] | None = None) -> dict[str, Any]:
    meta = {"name": f"{role}-binding", **({"namespace": namespace} if namespace else {})}
    return {"kind": kind, "metadata": meta, "roleRef": {"apiGroup": RBAC, "kind": role_kind, "name": role},
            "subjects": [subject or {"kind": "ServiceAccount", "name": "operator", "namespace": "ops"}]}


def roles(**rules: list[dict[str, Any]]) -> Any:
    return lambda kind, namespace, name: {"rules": rules[name]} if name in rules else None


JOBS = {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "create"]}
FINALIZERS = {"apiGroups": ["harnessrl.io"], "resources": ["*/finalizers"], "verbs": ["update"]}
BIND_ONE = {"apiGroups": [RBAC], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["sandbox"]}


def test_a_rule_matches_verb_group_resource_subresource_and_name_as_rbac_does() -> None:
    assert rule_allows(JOBS, Attributes("create", "batch", "jobs", namespace="a"))
    assert not rule_allows(JOBS, Attributes("delete", "batch", "jobs", namespace="a"))
    assert not rule_allows(JOBS, Attributes("get", "apps", "jobs", namespace="a"))
    assert not rule_allows(JOBS, Attributes("get", "batch", "jobs", "status", namespace="a"))  # not jobs/status
    assert rule_allows(FINALIZERS, Attributes("update", "harnessrl.io", "trainingruns", "finalizers", "a", "run"))
    assert not rule_allows(FINALIZERS, Attributes("update", "harnessrl.io", "trainingruns", None, "a", "run"))
    assert rule_allows(BIND_ONE, Attributes("bind", RBAC, "clusterroles", name="sandbox"))
    assert not rule_allows(BIND_ONE, Attributes("bind", RBAC, "clusterroles", name="cluster-admin"))
    assert not rule_allows(BIND_ONE, Attributes("bind", RBAC, "clusterroles"))  # names restrict: no name, no match


def test_bindings_grant_by_subject_and_scope() -> None:
    create_job = Attributes("create", "batch", "jobs", namespace="team-a")
    lookup = roles(jobs=[JOBS])
    assert allowed(OPERATOR, create_job, [binding("ClusterRoleBinding", "ClusterRole", "jobs")], lookup)
    in_a = binding("RoleBinding", "ClusterRole", "jobs", "team-a")
    assert allowed(OPERATOR, create_job, [in_a], lookup)
    assert not allowed(OPERATOR, Attributes("create", "batch", "jobs", namespace="team-b"), [in_a], lookup)
    # A ServiceAccount subject without a namespace is the binding's own namespace's account.
    local = binding("RoleBinding", "Role", "jobs", "team-a", {"kind": "ServiceAccount", "name": "operator"})
    assert not allowed(OPERATOR, create_job, [local], lookup)
    group = binding("ClusterRoleBinding", "ClusterRole", "jobs", None, {"kind": "Group", "name": "system:serviceaccounts:ops"})
    assert allowed(OPERATOR, create_job, [group], lookup)
    assert not allowed(OPERATOR, create_job, [binding("ClusterRoleBinding", "ClusterRole", "missing")], lookup)
    assert allowed(ADMIN, Attributes("delete", "", "nodes"), [], lookup)  # system:masters


def test_binding_a_role_needs_its_rights_or_bind_and_the_refusal_lists_what_is_missing() -> None:
    sandbox = [{"apiGroups": [""], "resources": ["pods", "pods/exec"], "verbs": ["create"]}]
    held = [binding("ClusterRoleBinding", "ClusterRole", "operator")]
    lookup = roles(operator=[JOBS, {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}])
    missing = missing_rights(OPERATOR, "team-a", sandbox, held, lookup)
    assert missing == [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}]
    assert escalation_message(OPERATOR, missing) == (
        'user "system:serviceaccount:ops:operator" (groups=["system:serviceaccounts" "system:serviceaccounts:ops" '
        '"system:authenticated"]) is attempting to grant RBAC permissions not currently held:\n'
        '{APIGroups:[""], Resources:["pods/exec"], Verbs:["create"]}')


def test_owner_references_need_finalizers_rights_to_block_and_delete_rights_to_change() -> None:
    owner = {"apiVersion": "harnessrl.io/v1alpha1", "kind": "TrainingRun", "name": "run", "uid": "u1"}
    plural_of = {("harnessrl.io/v1alpha1", "TrainingRun"): ("harnessrl.io", "trainingruns")}.get
    own = Attributes("update", "apps", "statefulsets", None, "a", "run-proxy")

    def child(*refs: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": "run-proxy", "ownerReferences": list(refs)}}

    def refusal(old: dict[str, Any] | None, new: dict[str, Any], *granted: str) -> str | None:
        def may(a: Attributes) -> bool:
            return f"{a.verb} {a.combined}" in granted
        return owner_reference_refusals(old, new, own, may, lambda v, k: plural_of((v, k)))

    blocking = {**owner, "blockOwnerDeletion": True}
    assert refusal(None, child(owner)) is None  # creating with a plain owner reference needs nothing more
    assert "can't set finalizers on" in (refusal(None, child(blocking)) or "")
    assert refusal(None, child(blocking), "update trainingruns/finalizers") is None
    assert refusal(child(blocking), child(blocking)) is None  # unchanged references: nothing to check
    assert refusal(child(), child(owner)) == "cannot set an ownerRef on a resource you can't delete: , <nil>"
    assert refusal(child(), child(owner), "delete statefulsets") is None
    assert "could not find the requested resource" in (
        refusal(None, child({**blocking, "kind": "Unknown"}), "update trainingruns/finalizers") or "")
