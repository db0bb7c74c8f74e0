"""Kubernetes API paths -> what they address. Pure.

kmock's own path parser cannot be used: it fails on `/api/v1/namespaces` (the namespace list) and reads
`/api/v1/namespaces/NAME` as a namespace scope rather than the Namespace object NAME.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Route:
    """`kind` is one of: root, version, health, api, apis, group, groupversion, resource, unknown."""

    kind: str
    group: str = ""
    version: str = ""
    plural: str = ""
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


_NAMESPACE_SUBRESOURCES = ("status", "finalize")


def parse_path(path: str) -> Route:
    parts = [p for p in path.split("/") if p]
    if not parts:
        return Route("root")
    if parts == ["version"]:
        return Route("version")
    if parts[0] in ("healthz", "livez", "readyz"):
        return Route("health")
    if parts[0] == "api":
        if len(parts) == 1:
            return Route("api")
        group, version, rest = "", parts[1], parts[2:]
    elif parts[0] == "apis":
        if len(parts) == 1:
            return Route("apis")
        if len(parts) == 2:
            return Route("group", group=parts[1])
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return Route("unknown")
    if not rest:
        return Route("groupversion", group=group, version=version)
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in _NAMESPACE_SUBRESOURCES:
        namespace, rest = rest[1], rest[2:]
    else:
        namespace = None
    if len(rest) > 3:
        return Route("unknown")
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else None
    return Route("resource", group=group, version=version, plural=plural, namespace=namespace, name=name,
                 subresource=subresource)
