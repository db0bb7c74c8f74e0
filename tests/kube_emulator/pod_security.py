"""Pod Security admission (k8s.io/pod-security-admission), as the API server applies it per namespace.

A namespace's `pod-security.kubernetes.io/enforce` label refuses Pods that violate its level (403, the
server's `violates PodSecurity "restricted:latest": …` text); its `warn` label answers Pods and the pod templates
of workload kinds with a `would violate PodSecurity …` warning. Enforce never applies to templates, as on a real
server: a Deployment is accepted and its Pods are refused. Only the `latest` version of each level is evaluated.

The checks (policy/check_*.go) with their forbidden reasons, reported in the server's order (sorted by check id):
baseline — host namespaces, privileged, capabilities beyond the baseline set, hostPath volumes, host ports,
Unconfined seccomp; restricted adds volume types, allowPrivilegeEscalation, runAsNonRoot, runAsUser=0, seccomp
and dropping ALL capabilities. The restricted texts follow the example in the Kubernetes docs (Pod Security
Admission); the baseline details are close, not verbatim. Not checked: AppArmor, SELinux options, procMount,
sysctls, Windows host process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

ENFORCE = "pod-security.kubernetes.io/enforce"
WARN = "pod-security.kubernetes.io/warn"
LEVELS = ("privileged", "baseline", "restricted")
# Workload kinds whose pod template PSA evaluates (the server's PodSpecExtractor).
TEMPLATE_KINDS = {("apps", "deployments"), ("apps", "statefulsets"), ("apps", "daemonsets"), ("apps", "replicasets"),
                  ("batch", "jobs"), ("", "replicationcontrollers")}
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                         "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                      "secret"}
VOLUME_SOURCES = RESTRICTED_VOLUMES | {
    "hostPath", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "nfs", "iscsi", "glusterfs", "rbd", "flexVolume",
    "cinder", "cephfs", "flocker", "fc", "azureFile", "vsphereVolume", "quobyte", "azureDisk", "photonPersistentDisk",
    "portworxVolume", "scaleIO", "storageos", "image"}

Spec = dict[str, Any]
Check = Callable[[Spec], "list[str]"]


def _containers(spec: Spec) -> Iterator[dict[str, Any]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(field) or []


def _names(containers: list[str], what: str = "container") -> str:
    quoted = ", ".join(f'"{n}"' for n in containers)
    return f"{what}s {quoted}" if len(containers) > 1 else f"{what} {quoted}"


def _sc(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("securityContext") or {}


# -- baseline ------------------------------------------------------------------------------------------------------
def host_namespaces(spec: Spec) -> list[str]:
    return [f"{field}=true" for field in ("hostNetwork", "hostPID", "hostIPC") if spec.get(field)]


def privileged(spec: Spec) -> list[str]:
    bad = [c.get("name", "") for c in _containers(spec) if _sc(c).get("privileged")]
    return [f"{_names(bad)} must not set securityContext.privileged=true"] if bad else []


def _added_beyond(spec: Spec, allowed: set[str]) -> list[str]:
    """The detail for containers that add capabilities outside `allowed` (empty when none do)."""
    def beyond(c: dict[str, Any]) -> list[str]:
        return [cap for cap in (_sc(c).get("capabilities") or {}).get("add") or [] if cap not in allowed]
    bad = [c.get("name", "") for c in _containers(spec) if beyond(c)]
    if not bad:
        return []
    caps = ", ".join(f'"{cap}"' for cap in sorted({cap for c in _containers(spec) for cap in beyond(c)}))
    return [f"{_names(bad)} must not include {caps} in securityContext.capabilities.add"]


def baseline_capabilities(spec: Spec) -> list[str]:
    return _added_beyond(spec, BASELINE_CAPABILITIES)


def host_path_volumes(spec: Spec) -> list[str]:
    bad = [v.get("name", "") for v in spec.get("volumes") or [] if "hostPath" in v]
    return [f"{_names(bad, 'volume')} use{'s' if len(bad) == 1 else ''} hostPath"] if bad else []


def host_ports(spec: Spec) -> list[str]:
    bad = [(c.get("name", ""), p["hostPort"]) for c in _containers(spec) for p in c.get("ports") or [] if p.get("hostPort")]
    return [f'{_names([n for n, _ in bad])} use{"s" if len(bad) == 1 else ""} hostPort '
            + ", ".join(str(p) for _, p in bad)] if bad else []


def _seccomp(obj: dict[str, Any]) -> str | None:
    return (_sc(obj).get("seccompProfile") or {}).get("type")


def unconfined_seccomp(spec: Spec) -> list[str]:
    details = ["pod must not set securityContext.seccompProfile.type to \"Unconfined\""] if _seccomp(spec) == "Unconfined" else []
    bad = [c.get("name", "") for c in _containers(spec) if _seccomp(c) == "Unconfined"]
    if bad:
        details.append(f'{_names(bad)} must not set securityContext.seccompProfile.type to "Unconfined"')
    return _one(details)


# -- restricted ----------------------------------------------------------------------------------------------------
def volume_types(spec: Spec) -> list[str]:
    bad = [(v.get("name", ""), next((k for k in v if k in VOLUME_SOURCES), "")) for v in spec.get("volumes") or []]
    bad = [(n, kind) for n, kind in bad if kind not in RESTRICTED_VOLUMES]
    if not bad:
        return []
    kinds = ", ".join(sorted({f'"{k}"' for _, k in bad}))
    return [f'{_names([n for n, _ in bad], "volume")} use{"s" if len(bad) == 1 else ""} restricted volume type{"s" if len(set(k for _, k in bad)) > 1 else ""} {kinds}']


def privilege_escalation(spec: Spec) -> list[str]:
    bad = [c.get("name", "") for c in _containers(spec) if _sc(c).get("allowPrivilegeEscalation") is not False]
    return [f"{_names(bad)} must set securityContext.allowPrivilegeEscalation=false"] if bad else []


def _where(spec: Spec, field: str, test: Callable[[Any], bool]) -> list[str]:
    """Names of the containers whose securityContext `field` passes `test`."""
    return [c.get("name", "") for c in _containers(spec) if test(_sc(c).get(field))]


def _one(details: list[str]) -> list[str]:
    return ["; ".join(details)] if details else []


def run_as_non_root(spec: Spec) -> list[str]:
    pod = _sc(spec).get("runAsNonRoot")
    details = ["pod must not set securityContext.runAsNonRoot=false"] if pod is False else []
    if explicit_false := _where(spec, "runAsNonRoot", lambda v: v is False):
        details.append(f"{_names(explicit_false)} must not set securityContext.runAsNonRoot=false")
    if pod is not True and (unset := _where(spec, "runAsNonRoot", lambda v: v is None)):
        details.append(f"pod or {_names(unset)} must set securityContext.runAsNonRoot=true")
    return _one(details)


def run_as_user(spec: Spec) -> list[str]:
    details = ["pod must not set runAsUser=0"] if _sc(spec).get("runAsUser") == 0 else []
    if root := _where(spec, "runAsUser", lambda v: v == 0):
        details.append(f"{_names(root)} must not set runAsUser=0")
    return _one(details)


def seccomp_profile(spec: Spec) -> list[str]:
    allowed = ("RuntimeDefault", "Localhost", None)
    pod = _seccomp(spec)
    details = [f'pod must not set securityContext.seccompProfile.type to "{pod}"'] if pod not in allowed else []
    if bad := _where(spec, "seccompProfile", lambda v: (v or {}).get("type") not in allowed):
        details.append(f'{_names(bad)} must not set securityContext.seccompProfile.type to "Unconfined"')
    if pod is None and (unset := _where(spec, "seccompProfile", lambda v: (v or {}).get("type") is None)):
        details.append(f'pod or {_names(unset)} must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"')
    return _one(details)


def dropped_capabilities(spec: Spec) -> list[str]:
    undropped = [c.get("name", "") for c in _containers(spec)
                 if "ALL" not in ((_sc(c).get("capabilities") or {}).get("drop") or [])]
    details = [f'{_names(undropped)} must set securityContext.capabilities.drop=["ALL"]'] if undropped else []
    details += _added_beyond(spec, {"NET_BIND_SERVICE"})
    return _one(details)


# (check id, level, forbidden reason, check); the server evaluates them sorted by id, and a restricted check
# replaces the baseline check of the same name (capabilities, seccompProfile).
CHECKS: list[tuple[str, str, str, Check]] = sorted([
    ("allowPrivilegeEscalation", "restricted", "allowPrivilegeEscalation != false", privilege_escalation),
    ("capabilities_baseline", "baseline", "non-default capabilities", baseline_capabilities),
    ("capabilities_restricted", "restricted", "unrestricted capabilities", dropped_capabilities),
    ("hostNamespaces", "baseline", "host namespaces", host_namespaces),
    ("hostPathVolumes", "baseline", "hostPath volumes", host_path_volumes),
    ("hostPorts", "baseline", "hostPort", host_ports),
    ("privileged", "baseline", "privileged", privileged),
    ("restrictedVolumes", "restricted", "restricted volume types", volume_types),
    ("runAsNonRoot", "restricted", "runAsNonRoot != true", run_as_non_root),
    ("runAsUser", "restricted", "runAsUser=0", run_as_user),
    ("seccompProfile_baseline", "baseline", "seccompProfile", unconfined_seccomp),
    ("seccompProfile_restricted", "restricted", "seccompProfile", seccomp_profile),
])
REPLACED_UNDER_RESTRICTED = {"capabilities_baseline", "seccompProfile_baseline"}


def violations(level: str, spec: Spec) -> list[str]:
    """`reason (detail)` for each check of `level` the pod spec fails, in the server's order."""
    if level == "privileged":
        return []
    found = []
    for check_id, check_level, reason, check in CHECKS:
        if check_level == "restricted" and level == "baseline":
            continue
        if level == "restricted" and check_id in REPLACED_UNDER_RESTRICTED:
            continue
        found += [f"{reason} ({detail})" for detail in check(spec)]
    return found


def level_of(labels: dict[str, str], mode_label: str) -> str:
    """The namespace's level for a mode; an unknown level is evaluated as restricted, as the server does."""
    value = labels.get(mode_label)
    if value is None:
        return "privileged"
    return value if value in LEVELS else "restricted"


def pod_spec_of(storage_key: tuple[str, str], obj: dict[str, Any]) -> Spec | None:
    if storage_key == ("", "pods"):
        return obj.get("spec") or {}
    if storage_key in TEMPLATE_KINDS:
        return ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    return None


def admit(storage_key: tuple[str, str], obj: dict[str, Any], namespace_labels: dict[str, str]) -> tuple[str | None, list[str]]:
    """(why creating `obj` is forbidden, or None; the warnings) in a namespace with these labels."""
    spec = pod_spec_of(storage_key, obj)
    if spec is None:
        return None, []
    refusal, warnings = None, []
    enforce = level_of(namespace_labels, ENFORCE)
    if storage_key == ("", "pods") and enforce != "privileged":
        found = violations(enforce, spec)
        if found:
            refusal = f'violates PodSecurity "{enforce}:latest": {", ".join(found)}'
    warn = level_of(namespace_labels, WARN)
    if warn != "privileged" and refusal is None:
        found = violations(warn, spec)
        if found:
            warnings.append(f'would violate PodSecurity "{warn}:latest": {", ".join(found)}')
    return refusal, warnings
