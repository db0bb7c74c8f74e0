"""The chart's ValidatingAdmissionPolicy on what runners create, evaluated as the API server does (match
conditions, then every validation; an evaluation error denies, failurePolicy Fail) with the same CEL language,
against the sandbox Pods and NetworkPolicies the runner really makes and against what a compromised runner might
try. The emulator does not run admission policies (it has no authentication to match a runner by), so this test
evaluates the policy directly."""

from __future__ import annotations

import copy
from typing import Any

import cel
import pytest
import yaml
from harnessrl.runtime.harness.config import KubernetesSandboxConfig
from harnessrl.runtime.harness.sandboxes.kubernetes import (
    network_policy_manifest,
    pod_manifest,
    sandbox_labels,
)

from tests.unit.test_chart_harnessrl import render
from tests.unit.test_operator_manifests import manifests

RUNNER = "system:serviceaccount:team-a:run-claude-code-runner"


def policy() -> dict[str, Any]:
    docs = render({})
    binding = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": "harnessrl-sandbox", "validationActions": ["Deny"]}
    return next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")


def denials(obj: dict[str, Any], username: str = RUNNER) -> list[str] | None:
    """None when the policy does not apply to the request; else the messages of the validations it fails."""
    spec = policy()["spec"]
    resource = {"Pod": ("", "pods"), "NetworkPolicy": ("networking.k8s.io", "networkpolicies")}[obj["kind"]]
    assert any(resource[0] in r["apiGroups"] and resource[1] in r["resources"] and "CREATE" in r["operations"]
               for r in spec["matchConstraints"]["resourceRules"])
    context = cel.Context()
    context.add_variable("request", {"kind": {"kind": obj["kind"]}, "operation": "CREATE",
                                     "userInfo": {"username": username}})
    context.add_variable("object", obj)
    if not all(cel.compile(c["expression"]).execute(context) is True for c in spec["matchConditions"]):
        return None
    failed = []
    for validation in spec["validations"]:
        try:
            ok = cel.compile(validation["expression"]).execute(context)
        except Exception:  # failurePolicy Fail: an expression that cannot be evaluated denies
            ok = False
        if ok is not True:
            failed.append(validation["message"])
    return failed


def sandbox_config() -> KubernetesSandboxConfig:
    """The kubernetes-sandbox config the operator renders for the example run's claude-code runners."""
    rendered = manifests()[("ConfigMap", "run-claude-code-runner-config")]
    return KubernetesSandboxConfig.model_validate(yaml.safe_load(rendered["data"]["config.yaml"])["sandbox"])


def runner_objects() -> tuple[dict[str, Any], dict[str, Any]]:
    config = sandbox_config()
    labels = sandbox_labels(config, "claude-code", "runner-0", "g1-r000", "sbx-1")
    return pod_manifest(config, "sbx-1", labels, deadline_s=600), network_policy_manifest(config, "sbx-1", labels)


def test_what_the_runner_creates_is_admitted_and_other_users_are_not_matched() -> None:
    pod, net = runner_objects()
    assert denials(pod) == [] and denials(net) == []
    bad = copy.deepcopy(pod)
    bad["spec"]["hostNetwork"] = True
    assert denials(bad, username="system:serviceaccount:harnessrl-system:harnessrl") is None  # the operator
    assert denials(bad, username="alice@example.com") is None


def _pod_with(change: Any) -> dict[str, Any]:
    pod = copy.deepcopy(runner_objects()[0])
    change(pod)
    return pod


def _net_with(change: Any) -> dict[str, Any]:
    net = copy.deepcopy(runner_objects()[1])
    change(net)
    return net


@pytest.mark.parametrize(("name", "obj", "message"), [
    ("any Pod", lambda: _pod_with(lambda p: p["metadata"]["labels"].pop("harnessrl.io/sandbox")), "only sandbox Pods"),
    ("an API token", lambda: _pod_with(lambda p: p["spec"].pop("automountServiceAccountToken")), "no API token"),
    ("the host network", lambda: _pod_with(lambda p: p["spec"].update(hostNetwork=True)), "no host namespace"),
    ("a hostPath", lambda: _pod_with(lambda p: p["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}})),
     "emptyDir volumes only"),
    ("an init container", lambda: _pod_with(lambda p: p["spec"].update(initContainers=[{"name": "i", "image": "x"}])),
     "its one container only"),
    ("root", lambda: _pod_with(lambda p: p["spec"]["securityContext"].update(runAsNonRoot=False)), "non-root"),
    ("privileged", lambda: _pod_with(lambda p: p["spec"]["containers"][0]["securityContext"].update(privileged=True)),
     "unprivileged"),
    ("another Pod's policy", lambda: _net_with(lambda n: n["spec"].update(podSelector={"matchLabels": {"harnessrl.io/component": "learner"}})),
     "selects one sandbox Pod"),
    ("open ingress", lambda: _net_with(lambda n: n["spec"].update(ingress=[{}])), "admits no ingress"),
    ("the internet", lambda: _net_with(lambda n: n["spec"]["egress"].append({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]})),
     "labelled Pods only"),
    ("every Pod", lambda: _net_with(lambda n: n["spec"]["egress"].append({"to": [{"namespaceSelector": {}}]})),
     "labelled Pods only"),
])
def test_what_a_compromised_runner_might_create_is_denied(name: str, obj: Any, message: str) -> None:
    failed = denials(obj())
    assert failed and any(message in m for m in failed), (name, failed)
