"""NetworkPolicies of a run: sandboxes reach only the proxy (and DNS); only the proxy and the learner reach
the engine; only the run's own Pods reach its proxy and learner, besides the operator (learner status) and
metrics scrapers. (The kubernetes sandbox also adds one per rollout; this run-wide one holds even if it fails to.)
Pure.

Defence in depth: every API is authenticated too. Scrapers are Pods in namespaces a cluster admin labels
METRICS_SCRAPER=true (tenants cannot label namespaces); the operator by its Pod's label (the chart sets it) *and*
its namespace's name (`kubernetes.io/metadata.name`, which the API server sets and nobody can change): a tenant's
own Pod labelled as the operator matches neither peer. DNS is the cluster's DNS Pods in kube-system only."""

from __future__ import annotations

from harnessrl.operator.kube.common import COMPONENT, RUN, Manifest, Owner, metadata, selector
from harnessrl.operator.plan.types import Component, ComponentKind, Plan
from harnessrl.runtime.contracts.kubernetes import tcp_ports

DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
METRICS_SCRAPER = "harnessrl.io/metrics-scraper"
SCRAPERS: Manifest = {"namespaceSelector": {"matchLabels": {METRICS_SCRAPER: "true"}}}
NAMESPACE_NAME = "kubernetes.io/metadata.name"  # set by the API server on every namespace: cannot be forged
DEFAULT_OPERATOR_NAMESPACE = "harnessrl-system"  # the chart's documented namespace; the operator passes its own
# The cluster's DNS (CoreDNS and kube-dns both carry k8s-app=kube-dns): the only port-53 peer a sandbox has.
CLUSTER_DNS: Manifest = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: "kube-system"}},
                         "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}


def operator_peer(namespace: str) -> Manifest:
    """The operator's Pods (the chart labels them) in the operator's own namespace, and nowhere else."""
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: namespace}},
            "podSelector": {"matchLabels": {COMPONENT: "operator"}}}


def sandbox_selector(plan: Plan) -> dict[str, str]:
    return {RUN: plan.run, COMPONENT: "sandbox"}


def manifests(plan: Plan, owner: Owner, operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE) -> list[Manifest]:
    proxy_ports = [p.port for p in plan.proxy.ports]
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
                    "to": [_pods(plan, ComponentKind.PROXY)],
                    # The replica's port and its workers' own ports after it (a session is served at its worker's).
                    "ports": [tcp_ports(min(proxy_ports), max(proxy_ports))],
                },
                {"to": [CLUSTER_DNS], "ports": DNS_PORTS},
            ],
        },
    }
    # A run on an EnginePool reaches the pool's servers, whose own policy admits it (kube/engine.py).
    engine = [engine_ingress(plan, owner, plan.engine.ports[0].port)] if plan.engine is not None else []
    runners = [runner_ingress(plan, owner, runner) for runner in plan.runners]
    return [sandboxes, *engine, proxy_ingress(plan, owner), learner_ingress(plan, owner, operator_namespace), *runners]


def engine_ingress(plan: Plan, owner: Owner, port: int) -> Manifest:
    """The run's proxy samples (and scrapers read /metrics) on the server port; the learner loads adapters over
    HTTP, and NCCL weight transfer connects on ephemeral ports."""
    return _ingress(plan, owner, ComponentKind.ENGINE, [
        {"from": [_pods(plan, ComponentKind.PROXY), SCRAPERS], "ports": [{"protocol": "TCP", "port": port}]},
        {"from": [_pods(plan, ComponentKind.LEARNER)]},
    ])


def _pods(plan: Plan, component: str) -> Manifest:
    """A peer: the run's Pods of one component (in the policy's own namespace)."""
    return {"podSelector": {"matchLabels": selector(plan.run, component)}}


def _ingress(plan: Plan, owner: Owner, component: ComponentKind, rules: list[Manifest]) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(plan, owner, f"{plan.run}-{component}", component),
        "spec": {"podSelector": {"matchLabels": selector(plan.run, component)}, "policyTypes": ["Ingress"],
                 "ingress": rules},
    }


def proxy_ingress(plan: Plan, owner: Owner) -> Manifest:
    """The proxy takes sessions from runners and their harnesses (sandboxes), sequences and policy from the
    learner, relays from its other replicas. E2B sandboxes call it from outside the cluster (through an Ingress
    or LoadBalancer): then any source may reach its ports, as the pool's proxyUrl already exposes them."""
    ports = [tcp_ports(min(p.port for p in plan.proxy.ports), max(p.port for p in plan.proxy.ports))]
    peers = [_pods(plan, kind) for kind in ("sandbox", ComponentKind.RUNNER, ComponentKind.LEARNER, ComponentKind.PROXY)]
    if any(pool.sandbox.e2b is not None for pool in plan.pools.values()):
        return _ingress(plan, owner, ComponentKind.PROXY, [{"ports": ports}])
    return _ingress(plan, owner, ComponentKind.PROXY, [{"from": [*peers, SCRAPERS], "ports": ports}])


def runner_ingress(plan: Plan, owner: Owner, runner: Component) -> Manifest:
    """A runner serves nothing but its /metrics (to scrapers): no other Pod reaches it. Each pool's runners have
    their own policy (their own name), selecting the run's runners of that pool."""
    ports = [{"protocol": "TCP", "port": p.port} for p in runner.ports]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(plan, owner, runner.name, runner.kind, runner.pool),
        "spec": {"podSelector": {"matchLabels": selector(plan.run, runner.kind, runner.pool)},
                 "policyTypes": ["Ingress"],
                 "ingress": [{"from": [SCRAPERS], "ports": ports}] if ports else []},
    }


def learner_ingress(plan: Plan, owner: Owner, operator_namespace: str) -> Manifest:
    """The coordinator takes leases and completions from runners, status reads from the operator and scrapes;
    the learner's other nodes (rendezvous, collectives) and the engines (NCCL weight transfer) reach any port."""
    coordinator = [{"protocol": "TCP", "port": plan.learner.ports[0].port}]
    return _ingress(plan, owner, ComponentKind.LEARNER, [
        {"from": [_pods(plan, ComponentKind.RUNNER), operator_peer(operator_namespace), SCRAPERS], "ports": coordinator},
        {"from": [_pods(plan, ComponentKind.LEARNER), _pods(plan, ComponentKind.ENGINE)]},
    ])
