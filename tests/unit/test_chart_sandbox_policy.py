"""The chart's ValidatingAdmissionPolicy on what runners create, delete and exec into, evaluated as the API server
does (every validation, per parameter; an evaluation error denies, failurePolicy Fail) with the same CEL language
(tests/kube_emulator/admission_policy.py, which the emulator applies to its requests too), against the sandbox
Pods and NetworkPolicies the runner really makes and against what a compromised runner might try."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
import yaml
from harnessrl.runtime.contracts.runner_config import KubernetesSandboxConfig
from harnessrl.runtime.harness.sandboxes.kubernetes import (
    grader_network_policy_manifest,
    network_policy_manifest,
    pod_manifest,
    sandbox_labels,
)

from tests.kube_emulator.admission_policy import Request, covers
from tests.kube_emulator.admission_policy import denials as policy_denials
from tests.kube_emulator.authz import User
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


def denials(obj: dict[str, Any], username: str = RUNNER, operation: str = "CREATE",
            params: list[dict[str, Any]] | None = None) -> list[str]:
    """The messages of the validations a request about `obj` fails, evaluated as the API server does
    (tests/kube_emulator/admission_policy.py): once per parameter (each runner RoleBinding of the namespace),
    variables then validations; a request must pass them all. CONNECT is an exec into the Pod `obj`."""
    meta = obj["metadata"]
    group = {"Pod": "", "NetworkPolicy": "networking.k8s.io"}[obj["kind"]]
    plural = {"Pod": "pods", "NetworkPolicy": "networkpolicies"}[obj["kind"]]
    connect = operation == "CONNECT"
    request = Request(operation, group, "v1", plural, "exec" if connect else None,
                      "PodExecOptions" if connect else obj["kind"], meta["namespace"], meta["name"], User(username))
    assert covers(policy(), request)
    target = {"kind": "PodExecOptions", "apiVersion": "v1", "command": ["sh"], "stdout": True} if connect else obj
    return policy_denials(policy(), runner_bindings(meta["namespace"]) if params is None else params, request,
                          target if operation in ("CREATE", "CONNECT") else None, obj if operation == "DELETE" else None)


def sandbox_config() -> KubernetesSandboxConfig:
    """The kubernetes-sandbox config the operator renders for the example run's claude-code runners."""
    rendered = manifests()[("ConfigMap", "run-claude-code-runner-config")]
    return KubernetesSandboxConfig.model_validate(yaml.safe_load(rendered["data"]["config.yaml"])["sandbox"])


SANDBOX_ID = "0123456789abcdef"


def runner_objects() -> tuple[dict[str, Any], dict[str, Any]]:
    """A rollout's Pod and NetworkPolicy as the runner names and makes them."""
    config = sandbox_config()
    name = config.name_prefix + SANDBOX_ID
    labels = sandbox_labels(config, "claude-code", "runner-0", "g1-r000", SANDBOX_ID)
    return pod_manifest(config, name, labels, deadline_s=600), network_policy_manifest(config, name, labels)


def test_what_the_runner_creates_is_admitted_and_other_users_are_not_matched() -> None:
    pod, net = runner_objects()
    assert len(runner_bindings()) == 2  # the claude-code and codex runners' bindings: checked against each
    assert denials(pod) == [] and denials(net) == []
    # A grader's Pod is the same manifest; its NetworkPolicy allows nothing.
    name = pod["metadata"]["name"]
    assert name == "run.claude-code." + SANDBOX_ID
    assert denials(grader_network_policy_manifest(sandbox_config(), name, pod["metadata"]["labels"])) == []
    assert denials(pod, operation="DELETE") == [] and denials(net, operation="DELETE") == []
    bad = copy.deepcopy(pod)
    bad["spec"]["hostNetwork"] = True
    bad["metadata"]["name"] = "debug-pod"  # not a sandbox's name: other users are held to nothing
    assert denials(bad, username="system:serviceaccount:harnessrl-system:harnessrl") == []  # the operator
    assert denials(bad, username="alice@example.com") == []
    # Not a name pattern: another product's `*-runner` ServiceAccount is not held to the sandbox rules.
    assert denials(bad, username="system:serviceaccount:team:gitlab-runner") == []
    gitlab = copy.deepcopy(bad)
    gitlab["metadata"] = {"name": "runner-abc", "namespace": "gitlab", "labels": {"app": "gitlab-runner"}}
    assert denials(gitlab, username="system:serviceaccount:gitlab:gitlab-runner") == []


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


EXEC = "only into its own run's and pool's sandbox Pods"


def _pod_named(name: str) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "team"}}


def test_a_runner_execs_into_its_own_sandbox() -> None:
    pod = runner_objects()[0]
    assert denials(pod, operation="CONNECT") == []
    # Others' exec is not the policy's to limit (RBAC decides it).
    assert denials(_pod_named("run-learner-0"), username="alice@example.com", operation="CONNECT") == []


@pytest.mark.parametrize("target", [
    "run-learner-0",  # holds the admin, runner and Hub tokens
    "run-proxy-7c9f8d6b5-x2x4k",
    "run-engine-0",
    "run-claude-code-runner-5d8f7c9b4-q7w2e",  # its own runner Pod (its API token)
    "other.claude-code.0123456789abcdef",  # another run's sandbox in the namespace
    "run.codex.0123456789abcdef",  # its run's other pool
    "run.claude-code-2.0123456789abcdef",  # a pool whose name extends its own
    "run-claude-code.x.0123456789abcdef",  # a run whose name extends its own
    "hrl-claude-code-0123456789ab",  # a sandbox named as before #48
])
def test_a_runner_execs_into_nothing_else(target: str) -> None:
    failed = denials(_pod_named(target), operation="CONNECT")
    assert failed and any(EXEC in m for m in failed), (target, failed)


PLANT = "only the run's runner creates Pods named as its sandboxes"


@pytest.mark.parametrize("username", [
    "alice@example.com",  # a tenant's user with Pod rights in the namespace
    "system:serviceaccount:harnessrl-system:harnessrl",
    "system:serviceaccount:team:run-codex-runner",  # the run's other pool's runner
    "system:serviceaccount:kube-system:replicaset-controller",  # for a Deployment named so
])
def test_nobody_else_creates_a_pod_named_as_a_runners_sandbox(username: str) -> None:
    """A Pod planted under the sandbox prefix would be one the runner may exec into."""
    failed = denials(runner_objects()[0], username=username)
    assert failed and any(PLANT in m for m in failed), (username, failed)


def test_a_runner_names_its_sandbox_objects_with_its_own_prefix() -> None:
    for obj in runner_objects():
        renamed = copy.deepcopy(obj)
        renamed["metadata"]["name"] = "other.claude-code.0123456789abcdef"  # where another run's runner may exec
        failed = denials(renamed)
        assert failed and any("names its sandbox objects" in m for m in failed), failed


def test_no_other_pod_of_a_run_can_carry_a_sandbox_prefix() -> None:
    """Why `<run>.<pool>.` is unambiguous: run and pool names are DNS labels (no dots, by their CRDs' rules), and
    every Pod a run's workloads make is named from a workload name without a dot (plus `-<ordinal>` or
    `-<hash>-<suffix>`), so no prefix `x.y.` starts one of them, nor another pool's or run's sandbox names."""
    for crd in ("trainingruns", "harnesspools"):
        text = (Path(__file__).resolve().parents[2] / "crds" / f"{crd}.harnessrl.io.yaml").read_text()
        assert r"self.metadata.name.matches('^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$')" in text, crd
    workloads = [m for m in manifests().values() if m["kind"] in ("StatefulSet", "Deployment", "Job", "Pod")]
    assert workloads and all("." not in m["metadata"]["name"] for m in workloads)
    assert sandbox_config().name_prefix == "run.claude-code."
