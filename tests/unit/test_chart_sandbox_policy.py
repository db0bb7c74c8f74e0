"""The chart's ValidatingAdmissionPolicy on what runners create, evaluated as the API server does (match
conditions, then every validation; an evaluation error denies, failurePolicy Fail) with the same CEL language,
against the sandbox Pods and NetworkPolicies the runner really makes and against what a compromised runner might
try. The emulator does not run admission policies (it has no authentication to match a runner by), so this test
evaluates the policy directly."""

from __future__ import annotations

import copy
import functools
from typing import Any

import cel
import pytest
import yaml
from harnessrl.runtime.contracts.runner_config import KubernetesSandboxConfig
from harnessrl.runtime.harness.sandboxes.kubernetes import (
    grader_network_policy_manifest,
    network_policy_manifest,
    pod_manifest,
    sandbox_labels,
)

from tests.unit.test_chart_harnessrl import render
from tests.unit.test_operator_manifests import manifests

RUNNER = "system:serviceaccount:team:run-claude-code-runner"  # the example run's runners (namespace team)


@functools.cache
def chart_policy() -> tuple[dict[str, Any], dict[str, Any]]:
    """The chart's policy and its binding."""
    docs = render({})
    binding = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == "harnessrl-sandbox" and binding["spec"]["validationActions"] == ["Deny"]
    return next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"), binding


def policy() -> dict[str, Any]:
    return chart_policy()[0]


@functools.cache
def _bindings() -> tuple[dict[str, Any], ...]:
    return tuple(m for (kind, _), m in manifests(harnesses=[{"pool": "claude-code"}, {"pool": "codex"}]).items()
                 if kind == "RoleBinding")


def runner_bindings(namespace: str = "team") -> list[dict[str, Any]]:
    """The policy's parameters in the request's namespace: the runner RoleBindings the operator renders there,
    selected as the chart's binding selects them."""
    selector = chart_policy()[1]["spec"]["paramRef"]["selector"]
    return [b for b in _bindings() if b["metadata"]["namespace"] == namespace
            and selector["matchLabels"].items() <= b["metadata"]["labels"].items()]


def _evaluate(expression: str, context: cel.Context) -> Any:
    try:
        return cel.compile(expression).execute(context)
    except Exception as exc:  # failurePolicy Fail: an expression that cannot be evaluated denies
        return exc


def denials(obj: dict[str, Any], username: str = RUNNER, operation: str = "CREATE",
            params: list[dict[str, Any]] | None = None) -> list[str] | None:
    """As the API server evaluates the policy: once per parameter (each runner RoleBinding of the namespace),
    variables then validations; a request must pass them all. None when no parameter names the requester as its
    runner (the policy holds nobody else to anything); else the messages of the validations it fails."""
    spec = policy()["spec"]
    resource = {"Pod": ("", "pods"), "NetworkPolicy": ("networking.k8s.io", "networkpolicies")}[obj["kind"]]
    assert any(resource[0] in r["apiGroups"] and resource[1] in r["resources"] and operation in r["operations"]
               for r in spec["matchConstraints"]["resourceRules"])
    matched, failed = False, []
    for param in runner_bindings(obj["metadata"]["namespace"]) if params is None else params:
        context = cel.Context()
        context.add_variable("request", {"kind": {"kind": obj["kind"]}, "operation": operation,
                                         "namespace": obj["metadata"]["namespace"], "userInfo": {"username": username}})
        context.add_variable("object", obj if operation == "CREATE" else None)
        context.add_variable("oldObject", obj if operation == "DELETE" else None)
        context.add_variable("params", param)
        variables: dict[str, Any] = {}
        for variable in spec["variables"]:
            context.add_variable("variables", variables)
            variables[variable["name"]] = _evaluate(variable["expression"], context)
        context.add_variable("variables", variables)
        matched |= variables["runner"] is True
        failed += [v["message"] for v in spec["validations"] if _evaluate(v["expression"], context) is not True]
    return failed if matched else None


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
    assert len(runner_bindings()) == 2  # the claude-code and codex runners' bindings: checked against each
    assert denials(pod) == [] and denials(net) == []
    # A grader's Pod is the same manifest; its NetworkPolicy allows nothing.
    assert denials(grader_network_policy_manifest(sandbox_config(), "sbx-1", pod["metadata"]["labels"])) == []
    assert denials(pod, operation="DELETE") == [] and denials(net, operation="DELETE") == []
    bad = copy.deepcopy(pod)
    bad["spec"]["hostNetwork"] = True
    assert denials(bad, username="system:serviceaccount:harnessrl-system:harnessrl") is None  # the operator
    assert denials(bad, username="alice@example.com") is None
    # Not a name pattern: another product's `*-runner` ServiceAccount is not held to the sandbox rules.
    assert denials(bad, username="system:serviceaccount:team:gitlab-runner") is None
    gitlab = copy.deepcopy(bad)
    gitlab["metadata"] = {"name": "runner-abc", "namespace": "gitlab", "labels": {"app": "gitlab-runner"}}
    assert denials(gitlab, username="system:serviceaccount:gitlab:gitlab-runner") is None


OWN = "only its own run's and pool's sandbox objects"


def _pod_with(change: Any) -> dict[str, Any]:
    pod = copy.deepcopy(runner_objects()[0])
    change(pod)
    return pod


def _net_with(change: Any) -> dict[str, Any]:
    net = copy.deepcopy(runner_objects()[1])
    change(net)
    return net


@pytest.mark.parametrize(("name", "obj", "message"), [
    ("any Pod", lambda: _pod_with(lambda p: p["metadata"]["labels"].pop("harnessrl.io/sandbox")), OWN),
    ("another run's labels", lambda: _pod_with(lambda p: p["metadata"]["labels"].update({"harnessrl.io/run": "other"})), OWN),
    ("another pool's labels", lambda: _pod_with(lambda p: p["metadata"]["labels"].update({"harnessrl.io/pool": "codex"})), OWN),
    ("container-level root", lambda: _pod_with(lambda p: p["spec"]["containers"][0]["securityContext"].update(runAsUser=0)),
     "no container-level root"),
    ("container runAsNonRoot false", lambda: _pod_with(
        lambda p: p["spec"]["containers"][0]["securityContext"].update(runAsNonRoot=False)), "no container-level root"),
    ("pod uid 0", lambda: _pod_with(lambda p: p["spec"]["securityContext"].update(runAsUser=0)), "non-root"),
    ("added capabilities", lambda: _pod_with(lambda p: p["spec"]["containers"][0]["securityContext"].update(
        capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]})), "adds no capabilities"),
    ("seccomp Unconfined", lambda: _pod_with(lambda p: p["spec"]["securityContext"].update(
        seccompProfile={"type": "Unconfined"})), "seccomp"),
    ("container seccomp Unconfined", lambda: _pod_with(lambda p: p["spec"]["containers"][0]["securityContext"].update(
        seccompProfile={"type": "Unconfined"})), "seccomp"),
    ("a host port", lambda: _pod_with(lambda p: p["spec"]["containers"][0].update(
        ports=[{"containerPort": 22, "hostPort": 2222}])), "no host port"),
    ("env from a Secret", lambda: _pod_with(lambda p: p["spec"]["containers"][0]["env"].append(
        {"name": "T", "valueFrom": {"secretKeyRef": {"name": "run-proxy-admin", "key": "token"}}})), "literal values"),
    ("envFrom a Secret", lambda: _pod_with(lambda p: p["spec"]["containers"][0].update(
        envFrom=[{"secretRef": {"name": "run-runner-token"}}])), "literal values"),
    ("another ServiceAccount", lambda: _pod_with(lambda p: p["spec"].update(serviceAccountName="harnessrl")),
     "default ServiceAccount"),
    ("a node", lambda: _pod_with(lambda p: p["spec"].update(nodeName="gpu-node-1")), "no nodeName"),
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
    ("another namespace's Pods", lambda: _net_with(lambda n: n["spec"]["egress"].append({"to": [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-b"}},
        "podSelector": {"matchLabels": {"harnessrl.io/component": "learner"}}}]})), "other namespaces only for"),
    ("port 53 anywhere", lambda: _net_with(lambda n: n["spec"]["egress"].append({"to": [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"app": "anything"}}}]})), "other namespaces only for"),
])
def test_what_a_compromised_runner_might_create_is_denied(name: str, obj: Any, message: str) -> None:
    failed = denials(obj())
    assert failed and any(message in m for m in failed), (name, failed)


def _other_run_pod() -> dict[str, Any]:
    return _pod_with(lambda p: p["metadata"]["labels"].update({"harnessrl.io/run": "other"}))


@pytest.mark.parametrize(("name", "obj"), [
    ("another run's sandbox", _other_run_pod),
    ("the learner", lambda: {"kind": "Pod", "metadata": {"name": "run-learner-0", "namespace": "team", "labels": {
        "harnessrl.io/run": "run", "harnessrl.io/component": "learner"}}, "spec": {}}),
    ("the run's NetworkPolicy", lambda: {"kind": "NetworkPolicy", "metadata": {
        "name": "run-learner", "namespace": "team", "labels": {"harnessrl.io/run": "run"}}, "spec": {}}),
])
def test_a_runner_deletes_only_its_own_sandbox_objects(name: str, obj: Any) -> None:
    failed = denials(obj(), operation="DELETE")
    assert failed and any(OWN in m for m in failed), (name, failed)
