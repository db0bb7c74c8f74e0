"""The few server-side behaviours of built-in kinds that operators trip over: initial status, Service IP
allocation, and the immutable fields a real API server refuses to change (with its wording). Pure."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from .resources import ResourceType

Cause = dict[str, str]

# Fields of a StatefulSet spec an update may change (apps/v1 validation, Kubernetes 1.33).
_STATEFULSET_MUTABLE = ("replicas", "ordinals", "template", "updateStrategy",
                        "persistentVolumeClaimRetentionPolicy", "minReadySeconds", "revisionHistoryLimit")
# Fields of a Pod spec an update may change.
_POD_MUTABLE = ("containers", "initContainers", "activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds",
                "schedulingGates")


def initial_status(rt: ResourceType) -> dict[str, Any] | None:
    """The status the API server gives a new object of a built-in kind (before any controller runs)."""
    if rt.storage_key in (("", "pods"), ("", "persistentvolumeclaims")):
        return {"phase": "Pending"}
    if rt.storage_key == ("", "services"):
        return {"loadBalancer": {}}
    return None


def allocate_cluster_ip(service: dict[str, Any], taken: set[str]) -> None:
    """Give a ClusterIP Service an address from 10.96.0.0/16, as the service IP allocator does."""
    spec = service.setdefault("spec", {})
    if spec.get("type", "ClusterIP") == "ExternalName" or spec.get("clusterIP"):
        spec.setdefault("clusterIPs", [spec["clusterIP"]] if spec.get("clusterIP") not in (None, "None") else ["None"])
        return
    for n in range(1, 65534):
        address = f"10.96.{n // 256}.{n % 256}"
        if n % 256 and address not in taken:
            spec["clusterIP"], spec["clusterIPs"] = address, [address]
            return


def normalize_secret(secret: dict[str, Any]) -> None:
    """stringData is write-only: the server merges it into data, base64-encoded."""
    string_data = secret.pop("stringData", None) or {}
    if string_data:
        data = secret.setdefault("data", {})
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()


def keep_cluster_ip(old: dict[str, Any], new: dict[str, Any]) -> None:
    """An update that leaves clusterIP out keeps the allocated one (as the server's update defaulting does)."""
    old_spec, spec = old.get("spec") or {}, new.setdefault("spec", {})
    for field in ("clusterIP", "clusterIPs"):
        if field in old_spec and not spec.get(field):
            spec[field] = old_spec[field]


def _immutable(field: str) -> Cause:
    return {"field": field, "reason": "FieldValueInvalid", "message": "Invalid value: \"object\": field is immutable"}


def _without(spec: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in fields}


def _statefulset(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    if _without(old.get("spec") or {}, _STATEFULSET_MUTABLE) == _without(new.get("spec") or {}, _STATEFULSET_MUTABLE):
        return []
    return [{"field": "spec", "reason": "FieldValueForbidden", "message":
             "Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', "
             "'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and "
             "'minReadySeconds' are forbidden"}]


def _fixed_fields(*fields: str) -> Callable[[dict[str, Any], dict[str, Any]], list[Cause]]:
    def check(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
        old_spec, spec = old.get("spec") or {}, new.get("spec") or {}
        return [_immutable(f"spec.{f}") for f in fields if old_spec.get(f) != spec.get(f)]
    return check


_JOB_SCHEDULING = ("nodeSelector", "tolerations", "affinity", "schedulingGates")


def _job(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """ValidateJobSpecUpdate: selector, completionMode and the Pod template are fixed, except that a suspended Job
    that has not started (startTime unset: the Job controller clears it on suspension) may change where its Pods
    go: the template's labels, annotations, nodeSelector, tolerations, affinity and schedulingGates."""
    causes = _fixed_fields("selector", "completionMode")(old, new)
    before, after = (old.get("spec") or {}).get("template") or {}, (new.get("spec") or {}).get("template") or {}
    if (old.get("spec") or {}).get("suspend") and not (old.get("status") or {}).get("startTime"):
        def fixed(template: dict[str, Any]) -> dict[str, Any]:
            meta = _without(template.get("metadata") or {}, ("labels", "annotations"))
            return {**template, "metadata": meta, "spec": _without(template.get("spec") or {}, _JOB_SCHEDULING)}
        before, after = fixed(before), fixed(after)
    return causes + ([_immutable("spec.template")] if before != after else [])


def _service(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    before, after = (old.get("spec") or {}).get("clusterIP"), (new.get("spec") or {}).get("clusterIP")
    if not before or before == after:
        return []
    return [{"field": "spec.clusterIP", "reason": "FieldValueInvalid", "message": f'Invalid value: "{after or ""}": field is immutable'}]


def _claim(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    mutable = ("resources", "volumeAttributesClassName", "volumeName")
    if _without(old.get("spec") or {}, mutable) == _without(new.get("spec") or {}, mutable):
        return []
    return [{"field": "spec", "reason": "FieldValueForbidden", "message":
             "Forbidden: spec is immutable after creation except resources.requests and "
             "volumeAttributesClassName for bound claims"}]


def _pod_shape(spec: dict[str, Any]) -> dict[str, Any]:
    containers = {f: [_without(c, ("image",)) for c in spec.get(f) or []] for f in ("containers", "initContainers")}
    return {**_without(spec, _POD_MUTABLE), **containers}


def _pod(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    if _pod_shape(old.get("spec") or {}) == _pod_shape(new.get("spec") or {}):
        return []
    return [{"field": "spec", "reason": "FieldValueForbidden", "message":
             "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
             "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` "
             "(only additions to existing tolerations), `spec.terminationGracePeriodSeconds` "
             "(allow it to be set to 1 if it was previously negative)"}]


def _immutable_data(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    if not old.get("immutable") or all(old.get(f) == new.get(f) for f in ("data", "binaryData", "immutable")):
        return []
    return [{"field": "data", "reason": "FieldValueForbidden", "message": "Forbidden: field is immutable when `immutable` is set"}]


def _role_ref(old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """ValidateRoleBindingUpdate; Go prints the new RoleRef with %#v."""
    ref = new.get("roleRef") or {}
    if (old.get("roleRef") or {}) == ref:
        return []
    go = f'rbac.RoleRef{{APIGroup:"{ref.get("apiGroup", "")}", Kind:"{ref.get("kind", "")}", Name:"{ref.get("name", "")}"}}'
    return [{"field": "roleRef", "reason": "FieldValueInvalid", "message": f"Invalid value: {go}: cannot change roleRef"}]


_UPDATE_RULES: dict[tuple[str, str], Callable[[dict[str, Any], dict[str, Any]], list[Cause]]] = {
    ("apps", "statefulsets"): _statefulset,
    ("apps", "deployments"): _fixed_fields("selector"),
    ("batch", "jobs"): _job,
    ("", "services"): _service,
    ("", "persistentvolumeclaims"): _claim,
    ("", "pods"): _pod,
    ("", "configmaps"): _immutable_data,
    ("", "secrets"): _immutable_data,
    ("rbac.authorization.k8s.io", "rolebindings"): _role_ref,
    ("rbac.authorization.k8s.io", "clusterrolebindings"): _role_ref,
}


def immutability_causes(rt: ResourceType, old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """Why the API server would refuse this update of a built-in object; empty when it would not."""
    rule = _UPDATE_RULES.get(rt.storage_key)
    return [] if rule is None else rule(old, new)
