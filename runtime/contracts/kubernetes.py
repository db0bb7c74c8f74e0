"""Kubernetes manifest parts the operator's manifests and the runner's sandbox Pods both render, so the two
cannot drift: the Pod Security "restricted" settings and a NetworkPolicy port entry."""

from __future__ import annotations

from typing import Any

# Pod Security "restricted": what every container, and every Pod running as `uid`, must set.
RESTRICTED_CONTAINER: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def restricted_pod(uid: int) -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"}}


def tcp_ports(first: int, last: int | None = None) -> dict[str, Any]:
    """A NetworkPolicy port entry: one port, or the range first..last."""
    return {"protocol": "TCP", "port": first, **({"endPort": last} if last is not None and last > first else {})}
