"""Two tenants, each a namespace with a run of the same name, sharing nothing but the cluster: every attack of
tenant B's Pods and runner on tenant A's run is refused. The manifests are the operator's (and the chart's RBAC
and sandbox policy); decisions are the emulator's RBAC (tests/kube_emulator/authz.py), the policy's CEL as the API
server evaluates it (tests/kube_emulator/admission_policy.py) and NetworkPolicies as a CNI enforces them
(tests/kube_emulator/network_policy.py)."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.kube import Owner, render
from harnessrl.operator.plan import build_plan
from harnessrl.operator.plan.placement import ClusterPlacement

from tests.kube_emulator.authz import Attributes, allowed, service_account
from tests.kube_emulator.network_policy import PodRef, connection_allowed
from tests.unit.test_chart_harnessrl import render as render_chart
from tests.unit.test_chart_sandbox_policy import EXEC, OWN, PLANT, denials, runner_objects
from tests.unit.test_operator_manifests import EXAMPLE, POOLS

TENANTS = ("tenant-a", "tenant-b")  # (the example run queues on a Kueue queue named team-a)
OPERATOR_NS = "harnessrl-system"


@functools.cache
def children(namespace: str) -> tuple[dict[str, Any], ...]:
    spec = TrainingRunSpec.model_validate(EXAMPLE["spec"] | {"harnesses": [{"pool": "claude-code"}], "eval": None})
    plan = build_plan("run", namespace, spec, {"claude-code": POOLS["claude-code"]}, ClusterPlacement(namespace))
    return tuple(render(plan, Owner(name="run", uid=f"uid-{namespace}"), OPERATOR_NS))


def policies() -> list[dict[str, Any]]:
    return [m for ns in TENANTS for m in children(ns) if m["kind"] == "NetworkPolicy"]


def pods_of(namespace: str) -> dict[str, PodRef]:
    """The run's Pods by component, with the labels their workloads give them, and a sandbox."""
    out = {m["metadata"]["labels"]["harnessrl.io/component"]: PodRef(namespace, m["spec"]["template"]["metadata"]["labels"])
           for m in children(namespace) if m["kind"] in ("StatefulSet", "Job", "Deployment")}
    out["sandbox"] = PodRef(namespace, {"harnessrl.io/run": "run", "harnessrl.io/component": "sandbox"})
    return out


def test_no_pod_of_one_tenant_reaches_the_others_run_on_any_port() -> None:
    a, b = pods_of("tenant-a"), pods_of("tenant-b")
    # B's own Pods, and B's Pods dressed in every label of A's (B may label its Pods as it likes).
    attackers = [*b.values(), *(PodRef("tenant-b", pod.labels) for pod in a.values()),
                 PodRef("tenant-b", {"harnessrl.io/component": "operator"})]
    ports = {8000, 8001, 8080, 8090, 9090, 29551}
    for target in a.values():
        for attacker in attackers:
            for port in ports:
                assert not connection_allowed(policies(), attacker, target, port), (attacker, target, port)
    # And A's sandboxes reach nothing of B's.
    for target in b.values():
        assert not any(connection_allowed(policies(), a["sandbox"], target, port) for port in ports), target
    # The run's own paths stay open (the policies do select and admit).
    assert connection_allowed(policies(), a["runner"], a["learner"], 8090)
    assert connection_allowed(policies(), a["sandbox"], a["proxy"], 8080)


def _sandbox_role() -> dict[str, Any]:
    docs = render_chart({})
    return next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "harnessrl-sandbox")


@pytest.mark.parametrize(("verb", "subresource"), [("create", None), ("delete", None), ("get", None),
                                                   ("create", "exec"), ("get", "log")])
def test_one_tenants_runner_has_no_rights_in_the_others_namespace(verb: str, subresource: str | None) -> None:
    role = _sandbox_role()
    bindings = [m for ns in TENANTS for m in children(ns) if m["kind"] == "RoleBinding"]
    runner_b = service_account("tenant-b", "run-claude-code-runner")

    def lookup(kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return role if (kind, name) == ("ClusterRole", "harnessrl-sandbox") else None

    assert allowed(runner_b, Attributes(verb, "", "pods", subresource, "tenant-b", "sbx"), bindings, lookup)
    assert not allowed(runner_b, Attributes(verb, "", "pods", subresource, "tenant-a", "run-learner-0"), bindings, lookup)


def test_one_tenants_runner_cannot_dress_its_sandboxes_as_the_others() -> None:
    """In its own namespace B's runner may create only its own run's sandboxes: not Pods labelled as A's run
    (which A's policies would then treat as A's), nor NetworkPolicies reaching into A's namespace."""
    pod, net = (copy.deepcopy(o) for o in runner_objects())
    for obj in (pod, net):
        obj["metadata"]["namespace"] = "tenant-b"
    runner_b = "system:serviceaccount:tenant-b:run-claude-code-runner"
    params = [m for m in children("tenant-b") if m["kind"] == "RoleBinding"]  # the policy's, in B's namespace
    check = functools.partial(denials, username=runner_b, params=params)
    assert check(pod) == [] and check(net) == []  # its own, in its own namespace
    dressed = copy.deepcopy(pod)
    dressed["metadata"]["labels"]["harnessrl.io/run"] = "run-of-a"
    failed = check(dressed)
    assert failed and any(OWN in m for m in failed), failed
    reaching = copy.deepcopy(net)
    reaching["spec"]["egress"].append({"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tenant-a"}},
                                               "podSelector": {"matchLabels": {"harnessrl.io/component": "learner"}}}]})
    failed = check(reaching)
    assert failed and any("other namespaces only for" in m for m in failed), failed


def test_no_credential_or_reference_of_one_tenant_is_in_the_others_manifests() -> None:
    for ns, other in (TENANTS, TENANTS[::-1]):
        text = repr(children(ns))
        assert other not in text
        secrets = {v["secret"]["secretName"] for m in children(ns) if m["kind"] in ("StatefulSet", "Job", "Deployment")
                   for v in m["spec"]["template"]["spec"].get("volumes", []) if "secret" in v}
        # Every Secret a Pod mounts is the run's own or one its spec names; a Secret volume is always of the Pod's
        # own namespace, so none of them is the other tenant's.
        assert secrets and all(s.startswith("run-") or s in repr(EXAMPLE["spec"]) for s in secrets), secrets


def test_one_tenants_runner_execs_only_into_its_own_sandboxes() -> None:
    """Exec: in A's namespace RBAC refuses B's runner outright (above); in its own, the sandbox policy refuses it
    every Pod but its run's sandboxes: not its learner (which holds the run's tokens), proxy or engine, and A's
    run of the same name gives it nothing either."""
    runner_b = "system:serviceaccount:tenant-b:run-claude-code-runner"
    params = [m for m in children("tenant-b") if m["kind"] == "RoleBinding"]
    pod = copy.deepcopy(runner_objects()[0])
    pod["metadata"]["namespace"] = "tenant-b"
    assert denials(pod, username=runner_b, operation="CONNECT", params=params) == []  # its own sandbox
    for name in ("run-learner-x2x4k", "run-proxy-0", "run-engine-0", "run-claude-code-runner-5d8f7c9b4-q7w2e"):
        target = {"kind": "Pod", "metadata": {"name": name, "namespace": "tenant-b"}}
        failed = denials(target, username=runner_b, operation="CONNECT", params=params)
        assert failed and any(EXEC in m for m in failed), (name, failed)
    # Nor may tenant B's users plant a Pod named as B's run's sandbox, for its runner to exec into.
    failed = denials(pod, username="bob@tenant-b.example", params=params)
    assert failed and any(PLANT in m for m in failed), failed
