"""NetworkPolicies of a run: sandboxes reach only the proxy (and DNS); only the proxy and the learner reach
the engine. (The kubernetes sandbox also adds one per rollout; this run-wide one holds even if it fails to.)
Pure."""

from __future__ import annotations

from harnessrl.operator.kube.common import COMPONENT, RUN, Manifest, Owner, metadata, selector
from harnessrl.operator.plan import ComponentKind, Plan
from harnessrl.runtime.harness.sandboxes.kubernetes import tcp_ports

DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


def sandbox_selector(plan: Plan) -> dict[str, str]:
    return {RUN: plan.run, COMPONENT: "sandbox"}


def manifests(plan: Plan, owner: Owner) -> list[Manifest]:
    proxy_ports = [p.port for p in plan.proxy.ports]
    engine_port = plan.engine.ports[0].port
    sandboxes = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(plan, owner, f"{plan.run}-sandboxes", "sandbox"),
        "spec": {
            "podSelector": {"matchLabels": sandbox_selector(plan)},
            "policyTypes": ["Ingress", "Egress"],
            # No ingress: exec into a sandbox goes through the API server and kubelet, not the Pod network.
            "ingress": [],
            "egress": [
                {
                    "to": [{"podSelector": {"matchLabels": selector(plan.run, ComponentKind.PROXY)}}],
                    # The replica's port and its workers' own ports after it (a session is served at its worker's).
                    "ports": [tcp_ports(min(proxy_ports), max(proxy_ports))],
                },
                {"to": [{"namespaceSelector": {}}], "ports": DNS_PORTS},
            ],
        },
    }
    engine = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(plan, owner, f"{plan.run}-engine", ComponentKind.ENGINE),
        "spec": {
            "podSelector": {"matchLabels": selector(plan.run, ComponentKind.ENGINE)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": selector(plan.run, ComponentKind.PROXY)}}],
                    "ports": [{"protocol": "TCP", "port": engine_port}],
                },
                # The learner loads adapters over HTTP, and NCCL weight transfer connects on ephemeral ports.
                {"from": [{"podSelector": {"matchLabels": selector(plan.run, ComponentKind.LEARNER)}}]},
            ],
        },
    }
    return [sandboxes, engine]
