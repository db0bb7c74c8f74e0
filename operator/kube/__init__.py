"""Plan -> Kubernetes manifests (plain dicts), one module per component. Pure: no API calls.

`render` gives every child of a run except the generated token Secrets (the proxy's admin token,
`proxy.admin_secret`, and the runners' coordinator token, `learner.runner_secret`), which the operator
generates once and keeps.
"""

from __future__ import annotations

from harnessrl.operator.kube import engine, learner, network, proxy, runner
from harnessrl.operator.kube.common import Manifest, Owner
from harnessrl.operator.plan.types import Plan

__all__ = ["Manifest", "Owner", "render"]


def render(plan: Plan, owner: Owner, operator_namespace: str = network.DEFAULT_OPERATOR_NAMESPACE) -> list[Manifest]:
    """Every manifest of the run, in a workable creation order (configs and services before workloads).
    `operator_namespace`: where the operator runs (its Pods alone may read the learner's status)."""
    out = [*engine.manifests(plan, owner), *proxy.manifests(plan, owner), *learner.manifests(plan, owner)]
    for component in plan.runners:
        out += runner.manifests(plan, owner, component)
    return [*out, *network.manifests(plan, owner, operator_namespace)]
