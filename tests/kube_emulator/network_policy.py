"""Which connections NetworkPolicies allow, as a CNI enforcing `networking.k8s.io/v1` decides (tests only).

The emulator has no Pod network: tests ask this evaluator instead, with a Pod's namespace, its labels and its
namespace's labels. `kubernetes.io/metadata.name` is added to every namespace's labels, as the API server does.
ipBlock peers match no Pod here (Pod IPs are not modelled). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .selectors import label_matcher, selector_string

Object = Mapping[str, Any]


@dataclass(frozen=True)
class PodRef:
    """A Pod as policies see it: where it lives, its labels, and its namespace's labels."""

    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace_labels: Mapping[str, str] = field(default_factory=dict)

    def ns_labels(self) -> dict[str, str]:
        return {**self.namespace_labels, "kubernetes.io/metadata.name": self.namespace}


def _selects(selector: Object, labels: Mapping[str, str]) -> bool:
    return label_matcher(selector_string(selector))({"metadata": {"labels": dict(labels)}})


def peer_matches(peer: Object, policy_namespace: str, pod: PodRef) -> bool:
    """A `from`/`to` entry: namespaceSelector and podSelector together select Pods of the selected namespaces;
    a podSelector alone, Pods of the policy's own namespace."""
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], pod.ns_labels()):
            return False
    elif pod.namespace != policy_namespace:
        return False
    return "podSelector" not in peer or _selects(peer["podSelector"], pod.labels)


def _port_matches(ports: list[Object] | None, port: int, protocol: str) -> bool:
    if not ports:
        return True
    for p in ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        first = p.get("port")
        if first is None or first == port or (isinstance(first, int) and first <= port <= p.get("endPort", first)):
            return True
    return False


def _allowed(policies: Iterable[Object], target: PodRef, other: PodRef, port: int, protocol: str,
             direction: str) -> bool:
    """Isolated in `direction` by any policy selecting `target`: then only a rule of one of them admits."""
    kind = "Ingress" if direction == "ingress" else "Egress"
    peers_key = "from" if direction == "ingress" else "to"
    selecting = [p for p in policies if p["metadata"]["namespace"] == target.namespace
                 and _selects(p["spec"]["podSelector"], target.labels)
                 and kind in p["spec"].get("policyTypes", ["Ingress"])]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(direction) or []:
            peers = rule.get(peers_key)
            if not _port_matches(rule.get("ports"), port, protocol):
                continue
            if peers is None or any(peer_matches(peer, policy["metadata"]["namespace"], other) for peer in peers):
                return True
    return False


def connection_allowed(policies: Iterable[Object], source: PodRef, destination: PodRef, port: int,
                       protocol: str = "TCP") -> bool:
    """Both ends' policies must allow it: the source's egress and the destination's ingress."""
    policies = list(policies)
    return (_allowed(policies, source, destination, port, protocol, "egress")
            and _allowed(policies, destination, source, port, protocol, "ingress"))
