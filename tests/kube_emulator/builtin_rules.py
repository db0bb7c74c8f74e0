"""The semantic validation of built-in kinds that an operator's bad input runs into, with the API server's
wording. Each check names the Kubernetes function its text comes from (pkg/apis/core/validation/validation.go,
pkg/apis/apps/validation/validation.go, apimachinery's metav1 validation). Pure: objects in, causes out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import go_text as t
from .quantity import Quantity, QuantityError, parse

Cause = dict[str, str]
_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_STANDARD_RESOURCES = (
    *_CONTAINER_RESOURCES, "pods", "services", "replicationcontrollers", "resourcequotas", "secrets", "configmaps", "persistentvolumeclaims",
    "services.nodeports", "services.loadbalancers", "requests.cpu", "requests.memory", "requests.ephemeral-storage",
    "requests.storage", "limits.cpu", "limits.memory", "limits.ephemeral-storage")
_EFFECTS = ["NoSchedule", "PreferNoSchedule", "NoExecute"]


# -- metadata (apimachinery/pkg/api/validation/objectmeta.go, metav1/validation) ---------------------------------
def validate_labels(labels: Any, path: str) -> list[Cause]:
    """ValidateLabels: every key a qualified name, every value a label value; the path names the map."""
    causes: list[Cause] = []
    for key, value in sorted((labels or {}).items()):
        causes += [t.invalid(path, key, m) for m in t.is_qualified_name(key)]
        causes += [t.invalid(path, value, m) for m in t.is_valid_label_value(str(value))]
    return causes


def _too_long(path: str, limit: int) -> Cause:
    """field.TooLong: the value is not printed, only the limit."""
    return {"field": path, "reason": "FieldValueTooLong", "message": f"Too long: may not be more than {limit} bytes"}


def validate_annotations(annotations: Any, path: str) -> list[Cause]:
    """ValidateAnnotations: keys are qualified names, case aside; 256 KiB in all."""
    causes = [t.invalid(path, key, m) for key in sorted(annotations or {}) for m in t.is_qualified_name(key.lower())]
    if sum(len(k) + len(str(v)) for k, v in (annotations or {}).items()) > 256 * 1024:
        causes.append(_too_long(path, 256 * 1024))
    return causes


def object_meta_causes(meta: dict[str, Any], path: str = "metadata") -> list[Cause]:
    return validate_labels(meta.get("labels"), f"{path}.labels") + validate_annotations(meta.get("annotations"), f"{path}.annotations")


# -- resources (ValidateResourceRequirements, validateContainerResourceName, ValidateResourceQuantityValue) ----------
def _is_native(name: str) -> bool:
    return "/" not in name or "kubernetes.io/" in name


def _is_extended(name: str) -> bool:
    return not _is_native(name) and not name.startswith("requests.") and not t.is_qualified_name("requests." + name)


def _overcommit_allowed(name: str) -> bool:
    return _is_native(name) and not name.startswith("hugepages-")


def _resource_name_causes(name: str, path: str) -> list[Cause]:
    causes = [t.invalid(path, name, m) for m in t.is_qualified_name(name)]
    if causes:
        return causes
    if "/" not in name:
        if name not in _STANDARD_RESOURCES and not name.startswith("hugepages-"):
            causes.append(t.invalid(path, name, "must be a standard resource type or fully qualified"))
        if name not in _CONTAINER_RESOURCES and not name.startswith("hugepages-"):
            causes.append(t.invalid(path, name, "must be a standard resource for containers"))
    elif not _is_native(name) and not _is_extended(name):
        causes.append(t.invalid(path, name, "doesn't follow extended resource name standard"))
    return causes


def _quantities(values: Any, path: str) -> tuple[dict[str, Quantity], list[Cause]]:
    parsed: dict[str, Quantity] = {}
    causes: list[Cause] = []
    for name, raw in sorted((values or {}).items()):
        at = f"{path}[{name}]"
        causes += _resource_name_causes(name, at)
        try:
            q = parse(raw)
        except QuantityError:
            continue  # a decode error, reported before validation
        parsed[name] = q
        if q.value < 0:
            causes.append(t.invalid(at, str(q), "must be greater than or equal to 0"))
        if _is_extended(name) and q.value % 1:
            causes.append(t.invalid(at, str(q), "must be an integer"))
    return parsed, causes


def resources_causes(resources: Any, path: str) -> list[Cause]:
    resources = resources or {}
    limits, causes = _quantities(resources.get("limits"), f"{path}.limits")
    requests, request_causes = _quantities(resources.get("requests"), f"{path}.requests")
    causes += request_causes
    for name, q in requests.items():
        limit = limits.get(name)
        if limit is None:
            if not _overcommit_allowed(name):
                causes.append(t.required(f"{path}.limits", "Limit must be set for non overcommitable resources"))
        elif q.value != limit.value and not _overcommit_allowed(name):
            causes.append(t.invalid(f"{path}.requests", str(q), f"must be equal to {name} limit of {limit}"))
        elif q.value > limit.value:
            causes.append(t.invalid(f"{path}.requests", str(q), f"must be less than or equal to {name} limit of {limit}"))
    return causes


# -- pod spec (ValidatePodSpec, validateContainers, ValidateTolerations) -----------------------------------------
def tolerations_causes(tolerations: Any, path: str) -> list[Cause]:
    causes: list[Cause] = []
    for n, tol in enumerate(tolerations or []):
        at = f"{path}[{n}]"
        key, operator, value, effect = tol.get("key") or "", tol.get("operator") or "", tol.get("value") or "", tol.get("effect") or ""
        if key:
            causes += [t.invalid(f"{at}.key", key, m) for m in t.is_qualified_name(key)]
        if not key and operator != "Exists":
            causes.append(t.invalid(f"{at}.operator", operator,
                                    'operator must be Exists when `key` is empty, which means "match all values and all keys"'))
        if tol.get("tolerationSeconds") is not None and effect != "NoExecute":
            causes.append(t.invalid(f"{at}.effect", effect, "effect must be 'NoExecute' when `tolerationSeconds` is set"))
        if operator in ("Equal", ""):
            errs = t.is_valid_label_value(value)
            if errs:
                causes.append(t.invalid(f"{at}.operator", value, ";".join(errs)))
        elif operator == "Exists":
            if value:  # the bad value is the value since 1.32 (kubernetes/kubernetes#128119), the whole Toleration before
                causes.append(t.invalid(f"{at}.operator", value, "value must be empty when `operator` is 'Exists'"))
        else:
            causes.append(t.not_supported(f"{at}.operator", operator, ["Equal", "Exists"]))
        if effect and effect not in _EFFECTS:
            causes.append(t.not_supported(f"{at}.effect", effect, _EFFECTS))
    return causes


def _container_causes(container: dict[str, Any], path: str) -> list[Cause]:
    name = container.get("name") or ""
    causes = [t.required(f"{path}.name")] if not name else [t.invalid(f"{path}.name", name, m) for m in t.is_dns1123_label(name)]
    if not container.get("image"):
        causes.append(t.required(f"{path}.image"))
    for n, env in enumerate(container.get("env") or []):
        env_name = env.get("name") or ""
        if not env_name:
            causes.append(t.required(f"{path}.env[{n}].name"))
        causes += [t.invalid(f"{path}.env[{n}].name", env_name, m) for m in t.is_env_var_name(env_name) if env_name]
    return causes + resources_causes(container.get("resources"), f"{path}.resources")


def pod_spec_causes(spec: dict[str, Any], path: str) -> list[Cause]:
    causes: list[Cause] = []
    containers = spec.get("containers") or []
    if not containers:
        causes.append(t.required(f"{path}.containers"))
    seen: set[str] = set()
    for field in ("initContainers", "containers"):
        for n, container in enumerate(spec.get(field) or []):
            causes += _container_causes(container, f"{path}.{field}[{n}]")
            if container.get("name") in seen:
                causes.append({"field": f"{path}.{field}[{n}].name", "reason": "FieldValueDuplicate",
                               "message": f"Duplicate value: {t.go_value(container.get('name'))}"})
            seen.add(container.get("name"))
    causes += tolerations_causes(spec.get("tolerations"), f"{path}.tolerations")
    causes += validate_labels(spec.get("nodeSelector"), f"{path}.nodeSelector")
    for field in ("runtimeClassName", "priorityClassName", "serviceAccountName"):
        value = spec.get(field)
        if value:
            causes += [t.invalid(f"{path}.{field}", value, m) for m in t.is_dns1123_subdomain(value)]
    return causes


def template_causes(template: dict[str, Any], path: str) -> list[Cause]:
    return object_meta_causes(template.get("metadata") or {}, f"{path}.metadata") + pod_spec_causes(template.get("spec") or {}, f"{path}.spec")


# -- selectors (ValidateLabelSelector, ValidateStatefulSetSpec / ValidateDeploymentSpec) --------------------------
def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if (op == "In" and (not present or labels[key] not in values)) or (op == "NotIn" and present and labels[key] in values) \
                or (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True


def label_selector_causes(selector: dict[str, Any], path: str) -> list[Cause]:
    causes = validate_labels(selector.get("matchLabels"), f"{path}.matchLabels")
    for n, expr in enumerate(selector.get("matchExpressions") or []):
        at = f"{path}.matchExpressions[{n}]"
        op = expr.get("operator")
        if op in ("In", "NotIn") and not expr.get("values"):
            causes.append(t.required(f"{at}.values", "must be specified when `operator` is 'In' or 'NotIn'"))
        elif op in ("Exists", "DoesNotExist") and expr.get("values"):
            causes.append({"field": f"{at}.values", "reason": "FieldValueForbidden",
                           "message": "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"})
        elif op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            causes.append(t.invalid(f"{at}.operator", op, "not a valid selector operator"))
        causes += [t.invalid(f"{at}.key", expr.get("key"), m) for m in t.is_qualified_name(expr.get("key") or "")]
    return causes


def _selected_workload(what: str) -> Callable[[dict[str, Any]], list[Cause]]:
    def check(obj: dict[str, Any]) -> list[Cause]:
        spec = obj.get("spec") or {}
        template = spec.get("template") or {}
        selector = spec.get("selector")
        causes: list[Cause] = []
        if selector is None:
            causes.append(t.required("spec.selector"))
        else:
            causes += label_selector_causes(selector, "spec.selector")
            if not selector.get("matchLabels") and not selector.get("matchExpressions"):
                causes.append(t.invalid("spec.selector", selector, f"empty selector is invalid for {what}"))
            else:
                labels = (template.get("metadata") or {}).get("labels") or {}
                if not selector_matches(selector, labels):
                    causes.append(t.invalid("spec.template.metadata.labels", labels, "`selector` does not match template `labels`"))
        if spec.get("replicas") is not None and spec["replicas"] < 0:
            causes.append(t.invalid("spec.replicas", spec["replicas"], "must be greater than or equal to 0"))
        return causes + template_causes(template, "spec.template")
    return check


def _job(obj: dict[str, Any]) -> list[Cause]:
    spec = obj.get("spec") or {}
    template = spec.get("template") or {}
    causes = template_causes(template, "spec.template")
    policy = (template.get("spec") or {}).get("restartPolicy")
    if policy not in ("OnFailure", "Never"):
        causes.append(t.required("spec.template.spec.restartPolicy", 'valid values: "OnFailure", "Never"'))
    return causes


def _pod(obj: dict[str, Any]) -> list[Cause]:
    return pod_spec_causes(obj.get("spec") or {}, "spec")


def _service(obj: dict[str, Any]) -> list[Cause]:
    return validate_labels((obj.get("spec") or {}).get("selector"), "spec.selector")


def _network_policy(obj: dict[str, Any]) -> list[Cause]:
    return label_selector_causes((obj.get("spec") or {}).get("podSelector") or {}, "spec.podSelector")


_MAX_DATA_BYTES = 1024 * 1024  # core.MaxSecretSize, for ConfigMaps too


def _data(whole: str, encoded: tuple[str, ...]) -> Callable[[dict[str, Any]], list[Cause]]:
    """ValidateConfigMap / ValidateSecret: keys, and 1 MiB of values in all (base64 fields counted decoded);
    a ConfigMap's refusal names the whole object (Go prints the empty path as `[]`), a Secret's its data."""
    def check(obj: dict[str, Any]) -> list[Cause]:
        causes = [t.invalid(f"{field}[{key}]", key, m) for field in ("data", "binaryData", "stringData")
                  for key in sorted(obj.get(field) or {}) for m in t.is_config_map_key(key)]
        size = sum(len(value) * 3 // 4 - value.count("=") if field in encoded else len(str(value).encode())
                   for field in ("data", "binaryData", "stringData") for value in (obj.get(field) or {}).values())
        if size > _MAX_DATA_BYTES:
            causes.append(_too_long(whole, _MAX_DATA_BYTES))
        return causes
    return check


_RULES: dict[tuple[str, str], Callable[[dict[str, Any]], list[Cause]]] = {
    ("apps", "statefulsets"): _selected_workload("statefulset"),
    ("apps", "deployments"): _selected_workload("deployment"),
    ("batch", "jobs"): _job,
    ("", "pods"): _pod,
    ("", "services"): _service,
    ("networking.k8s.io", "networkpolicies"): _network_policy,
    ("", "configmaps"): _data("[]", encoded=("binaryData",)),
    ("", "secrets"): _data("data", encoded=("data",)),
}


def semantic_causes(storage_key: tuple[str, str], obj: dict[str, Any]) -> list[Cause]:
    """Why the API server's validation would refuse this built-in object; empty when it would not."""
    rule = _RULES.get(storage_key)
    return object_meta_causes(obj.get("metadata") or {}) + (rule(obj) if rule else [])
