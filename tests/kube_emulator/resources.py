"""What the emulator serves: resource types (built-in and from CRDs) and how discovery lists them."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict


class ScalePaths(BaseModel):
    """Where the scale subresource reads and writes replicas (the CRD `subresources.scale` block)."""

    model_config = ConfigDict(frozen=True)
    spec_replicas: str = ".spec.replicas"
    status_replicas: str = ".status.replicas"
    label_selector: str | None = None


class ResourceType(BaseModel):
    """One served group/version/plural."""

    model_config = ConfigDict(frozen=True)
    group: str
    version: str
    plural: str
    kind: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status_subresource: bool = False
    scale: ScalePaths | None = None
    # metadata.generation is kept (and bumped on spec changes) only where the real server keeps it.
    generation: bool = False
    # openAPIV3Schema of a custom resource version; None for built-in kinds (not validated here).
    openapi_schema: dict[str, Any] | None = None
    custom: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage_key(self) -> tuple[str, str]:
        """Objects are stored per group+plural; all served versions of a CRD share them."""
        return (self.group, self.plural)

    @property
    def label(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def discovery_entries(self) -> list[dict[str, Any]]:
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        main = {
            "name": self.plural, "singularName": self.singular, "namespaced": self.namespaced,
            "kind": self.kind, "verbs": verbs, "shortNames": list(self.short_names),
            "categories": list(self.categories),
        }
        entries = [main]
        if self.status_subresource:
            entries.append({"name": f"{self.plural}/status", "singularName": "", "namespaced": self.namespaced,
                            "kind": self.kind, "verbs": ["get", "patch", "update"]})
        if self.scale is not None:
            entries.append({"name": f"{self.plural}/scale", "singularName": "", "namespaced": self.namespaced,
                            "group": "autoscaling", "version": "v1", "kind": "Scale",
                            "verbs": ["get", "patch", "update"]})
        return entries


_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Sort key of Kubernetes version priority: GA > beta > alpha, higher numbers first, others last."""
    match = _VERSION.match(version)
    if match is None:
        return (3, 0, 0, version)
    major, stage, minor = int(match[1]), match[2], int(match[3] or 0)
    rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (rank, -major, -minor, "")


def _builtin(group: str, version: str, plural: str, kind: str, namespaced: bool = True, **extra: Any) -> ResourceType:
    return ResourceType(group=group, version=version, plural=plural, kind=kind, singular=kind.lower(),
                        namespaced=namespaced, **extra)


_WORKLOAD_SCALE = ScalePaths(label_selector=".spec.selector")

BUILTIN_RESOURCES: tuple[ResourceType, ...] = (
    _builtin("", "v1", "namespaces", "Namespace", namespaced=False, status_subresource=True, short_names=("ns",)),
    _builtin("", "v1", "pods", "Pod", status_subresource=True, generation=True, short_names=("po",)),
    _builtin("", "v1", "services", "Service", status_subresource=True, short_names=("svc",)),
    _builtin("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    _builtin("", "v1", "secrets", "Secret"),
    _builtin("", "v1", "serviceaccounts", "ServiceAccount", short_names=("sa",)),
    _builtin("", "v1", "events", "Event", short_names=("ev",)),
    _builtin("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", status_subresource=True,
             short_names=("pvc",)),
    _builtin("apps", "v1", "statefulsets", "StatefulSet", status_subresource=True, generation=True,
             scale=_WORKLOAD_SCALE, short_names=("sts",)),
    _builtin("apps", "v1", "deployments", "Deployment", status_subresource=True, generation=True,
             scale=_WORKLOAD_SCALE, short_names=("deploy",)),
    _builtin("batch", "v1", "jobs", "Job", status_subresource=True, generation=True),
    _builtin("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", generation=True,
             short_names=("netpol",)),
    _builtin("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    _builtin("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    _builtin("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    _builtin("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    _builtin("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy",
             namespaced=False, status_subresource=True, generation=True),
    _builtin("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
             "ValidatingAdmissionPolicyBinding", namespaced=False, generation=True),
    _builtin("coordination.k8s.io", "v1", "leases", "Lease"),
    _builtin("events.k8s.io", "v1", "events", "Event", short_names=("ev",)),
    _builtin("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
             namespaced=False, status_subresource=True, generation=True, short_names=("crd", "crds")),
)

INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def resource_types_of_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """The served resource types of a CustomResourceDefinition (one per served version)."""
    spec = crd["spec"]
    names = spec["names"]
    types = []
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        subresources = version.get("subresources") or {}
        scale = subresources.get("scale")
        types.append(ResourceType(
            group=spec["group"], version=version["name"], plural=names["plural"], kind=names["kind"],
            singular=names.get("singular") or names["kind"].lower(),
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            short_names=tuple(names.get("shortNames") or ()), categories=tuple(names.get("categories") or ()),
            status_subresource="status" in subresources,
            scale=None if scale is None else ScalePaths(
                spec_replicas=scale["specReplicasPath"], status_replicas=scale["statusReplicasPath"],
                label_selector=scale.get("labelSelectorPath"),
            ),
            generation=True,
            openapi_schema=(version.get("schema") or {}).get("openAPIV3Schema"),
            custom=True,
        ))
    return types


def crd_problems(crd: dict[str, Any]) -> list[dict[str, str]]:
    """Structural checks the real server makes before it accepts a CRD (the ones that break serving)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    problems: list[dict[str, str]] = []

    def need(field: str, ok: bool, message: str = "Required value") -> None:
        if not ok:
            problems.append({"field": field, "message": message, "reason": "FieldValueRequired"})

    need("spec.group", bool(spec.get("group")))
    need("spec.names.plural", bool(names.get("plural")))
    need("spec.names.kind", bool(names.get("kind")))
    need("spec.versions", bool(spec.get("versions")), "Invalid value: null: must have exactly one version marked as storage version")
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        problems.append({"field": "spec.scope", "message": f'Unsupported value: "{spec.get("scope")}": supported values: "Cluster", "Namespaced"',
                         "reason": "FieldValueNotSupported"})
    if spec.get("group") and names.get("plural"):
        expected = f"{names['plural']}.{spec['group']}"
        if crd.get("metadata", {}).get("name") != expected:
            problems.append({"field": "metadata.name", "reason": "FieldValueInvalid",
                             "message": f'Invalid value: "{crd.get("metadata", {}).get("name")}": must be spec.names.plural+"."+spec.group'})
    storage = [v for v in spec.get("versions") or [] if v.get("storage")]
    if spec.get("versions") and len(storage) != 1:
        problems.append({"field": "spec.versions", "reason": "FieldValueInvalid",
                         "message": f"Invalid value: {len(storage)}: must have exactly one version marked as storage version"})
    return problems
