"""A rendered Pod → what `podman run` needs to start it as a kubelet would (`make cluster-check`). Pure.

podman 4.3's `kube play` refuses env from `fieldRef: status.podIP` and from a Secret's key, and fails on init
containers, so each container is started with plain `podman run` and the options its Pod spec maps to: command and
args, env (Secret keys and the downward API resolved), ConfigMap and Secret files with their modes, emptyDirs and
claims as directories, `runAsUser`/`runAsGroup`/`fsGroup`, dropped capabilities and a read-only root. Files are
described here and written by the caller (checks/cluster.py).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from pydantic import BaseModel, ConfigDict

Manifest = dict[str, Any]
DEFAULT_MODE = 0o644  # a ConfigMap or Secret volume's files without defaultMode


class File(BaseModel):
    """One file of a ConfigMap or Secret volume: its path inside the volume, content and mode."""

    model_config = ConfigDict(frozen=True)

    path: str
    content: bytes
    mode: int


class Volume(BaseModel):
    """A Pod volume as the caller makes it: `files` written into a fresh directory (configMap, secret), an empty
    directory (emptyDir, a claim the check has no source for), or `claim` (a claim the check maps to a directory)."""

    model_config = ConfigDict(frozen=True)

    name: str
    files: tuple[File, ...] = ()
    claim: str | None = None
    memory: bool = False  # emptyDir medium Memory: a tmpfs


class PodContext(BaseModel):
    """What a kubelet knows about the Pod it starts: its name, namespace, IP, and the cluster's objects."""

    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    ip: str
    config_maps: dict[str, dict[str, str]] = {}
    secrets: dict[str, dict[str, bytes]] = {}


class UnsupportedSpec(ValueError):
    """A Pod spec field this translation does not map (the check reports it rather than start something else)."""


def secret_data(secret: Manifest) -> dict[str, bytes]:
    """A Secret's keys as the kubelet sees them: `data` base64-decoded, `stringData` over it."""
    out = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    return out | {k: v.encode() for k, v in (secret.get("stringData") or {}).items()}


def volumes(spec: Manifest, ctx: PodContext) -> list[Volume]:
    """Each volume of a Pod spec, with the files its ConfigMap or Secret projects (`items` select keys)."""
    out = []
    for vol in spec.get("volumes") or []:
        name = vol["name"]
        if "configMap" in vol:
            src = vol["configMap"]
            data = {k: v.encode() for k, v in ctx.config_maps[src["name"]].items()}
            out.append(Volume(name=name, files=projected(data, src)))
        elif "secret" in vol:
            src = vol["secret"]
            out.append(Volume(name=name, files=projected(ctx.secrets[src["secretName"]], src)))
        elif "emptyDir" in vol:
            out.append(Volume(name=name, memory=(vol["emptyDir"] or {}).get("medium") == "Memory"))
        elif "persistentVolumeClaim" in vol:
            out.append(Volume(name=name, claim=vol["persistentVolumeClaim"]["claimName"]))
        else:
            kinds = sorted(set(vol) - {"name"})
            raise UnsupportedSpec(f"volume {name}: {kinds} (only configMap, secret, emptyDir, persistentVolumeClaim)")
    return out


def projected(data: dict[str, bytes], source: Manifest) -> tuple[File, ...]:
    mode = source.get("defaultMode", DEFAULT_MODE)
    items = source.get("items") or [{"key": k, "path": k} for k in sorted(data)]
    return tuple(File(path=i["path"], content=data[i["key"]], mode=i.get("mode", mode)) for i in items)


def env(container: Manifest, ctx: PodContext) -> dict[str, str]:
    """A container's env with `valueFrom` resolved (downward API fields, Secret and ConfigMap keys)."""
    fields = {"metadata.name": ctx.name, "metadata.namespace": ctx.namespace, "status.podIP": ctx.ip}
    out = {}
    for var in container.get("env") or []:
        source = var.get("valueFrom")
        if source is None:
            out[var["name"]] = var.get("value", "")
        elif "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if path not in fields:
                raise UnsupportedSpec(f"env {var['name']}: fieldRef {path}")
            out[var["name"]] = fields[path]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            out[var["name"]] = ctx.secrets[ref["name"]][ref["key"]].decode()
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            out[var["name"]] = ctx.config_maps[ref["name"]][ref["key"]]
        else:
            raise UnsupportedSpec(f"env {var['name']}: {sorted(source)}")
    return out


def run_argv(
    spec: Manifest, container: Manifest, ctx: PodContext, *, name: str, network: str,
    volume_dirs: dict[str, str], hosts: dict[str, str], join: str | None = None,
) -> list[str]:
    """`podman run` for one container of a Pod. `volume_dirs`: where the caller made each volume (a host
    directory, or "tmpfs"); `hosts`: every name the Pod resolves (Services, Pods) to its address; `join`: the Pod's
    container already running, whose network (address, hosts) this one shares, as a Pod's containers do."""
    pod_sec = spec.get("securityContext") or {}
    sec = container.get("securityContext") or {}
    argv = ["podman", "run", "-d", "--name", name]
    if join is None:
        argv += ["--hostname", ctx.name, "--network", network, "--ip", ctx.ip]
        argv += [a for host, address in sorted(hosts.items()) for a in ("--add-host", f"{host}:{address}")]
    else:
        argv += ["--network", f"container:{join}"]
    uid, gid = sec.get("runAsUser", pod_sec.get("runAsUser")), sec.get("runAsGroup", pod_sec.get("runAsGroup"))
    if uid is not None:
        argv += ["--user", f"{uid}:{gid if gid is not None else 0}"]
    if "fsGroup" in pod_sec:
        argv += ["--group-add", str(pod_sec["fsGroup"])]
    if sec.get("readOnlyRootFilesystem"):
        # podman's --read-only mounts tmpfs on /tmp, /var/tmp and /run by default; a kubelet does not.
        argv += ["--read-only", "--read-only-tmpfs=false"]
    for cap in (sec.get("capabilities") or {}).get("drop") or []:
        argv += ["--cap-drop", cap]
    for cap in (sec.get("capabilities") or {}).get("add") or []:
        argv += ["--cap-add", cap]
    if sec.get("allowPrivilegeEscalation") is False:
        argv += ["--security-opt", "no-new-privileges"]
    if container.get("workingDir"):
        argv += ["--workdir", container["workingDir"]]
    for key, value in env(container, ctx).items():
        argv += ["--env", f"{key}={value}"]
    for mount in container.get("volumeMounts") or []:
        where = volume_dirs[mount["name"]]
        if mount.get("subPath"):
            raise UnsupportedSpec(f"volumeMount {mount['name']}: subPath")
        if where == "tmpfs":
            argv += ["--tmpfs", mount["mountPath"]]
        else:
            argv += ["--volume", f"{where}:{mount['mountPath']}:{'ro' if mount.get('readOnly') else 'rw'}"]
    if "command" in container:
        # A Pod's command replaces the image's entrypoint and its CMD (podman's --entrypoint clears CMD too).
        argv += ["--entrypoint", json.dumps(container["command"])]
    return [*argv, container["image"], *(container.get("args") or [])]


def probe_url(container: Manifest, ip: str) -> str | None:
    """Where a kubelet would send the container's readiness probe (httpGet only); None: it has none."""
    probe = (container.get("readinessProbe") or {}).get("httpGet")
    if probe is None:
        return None
    port = probe["port"]
    if isinstance(port, str):
        port = next(p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port)
    return f"http://{ip}:{port}{probe.get('path', '/')}"


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def service_target(service: Manifest, pod_spec: Manifest, port: Manifest) -> int:
    """The container port a Service port forwards to (a named targetPort looks it up in the Pod's containers)."""
    target = port.get("targetPort", port["port"])
    if isinstance(target, int):
        return target
    for container in pod_spec.get("containers") or []:
        for p in container.get("ports") or []:
            if p.get("name") == target:
                return int(p["containerPort"])
    raise UnsupportedSpec(f"Service {service['metadata']['name']}: no container port named {target}")
