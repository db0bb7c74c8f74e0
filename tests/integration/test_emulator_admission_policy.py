"""The emulator's ValidatingAdmissionPolicy (tests/kube_emulator/admission_policy.py) over HTTP: a policy that
limits one ServiceAccount's exec and Pod creation, bound with a ConfigMap parameter, applied after RBAC with the
server's refusal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream

from tests.fixtures.kube import running_emulator
from tests.kube_emulator.authz import service_account
from tests.kube_emulator.client import KubeApiError

TOKEN = "bot-token"
POLICY = {
    "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": "only-own"},
    "spec": {
        "failurePolicy": "Fail",
        "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
        "matchConstraints": {"resourceRules": [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "DELETE"], "resources": ["pods"]},
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CONNECT"], "resources": ["pods/exec"]}]},
        "variables": [{"name": "bot", "expression": "request.userInfo.username == params.data.user"}],
        "validations": [
            {"expression": "!variables.bot || request.operation != 'CONNECT' || request.name.startsWith(params.data.prefix)",
             "message": "the bot execs only into its own Pods"},
            {"expression": "request.operation != 'DELETE' || oldObject.metadata.name != 'keep'"},
        ],
    },
}
BINDING = {
    "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
    "metadata": {"name": "only-own-binding"},
    "spec": {"policyName": "only-own", "validationActions": ["Deny"],
             "paramRef": {"selector": {"matchLabels": {"policy": "only-own"}}, "parameterNotFoundAction": "Allow"}},
}
EXEC_RIGHTS = [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "exec", "namespace": "default"},
     "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "exec", "namespace": "default"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "exec"},
     "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "default"}]},
]


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def exec_as_bot(api: Any, name: str) -> str:
    core = k8s.CoreV1Api(api.client(TOKEN))
    return str(stream(core.connect_get_namespaced_pod_exec, name, "default", command=["echo", "hi"],
                      stderr=True, stdin=False, stdout=True, tty=False))


def test_a_policy_admits_by_its_parameters_after_rbac(tmp_path: Path) -> None:
    with running_emulator(tmp_path, {TOKEN: service_account("default", "bot")}) as api:
        api.apply([POLICY, BINDING, pod("bot-1"), pod("other"), pod("keep")])
        for name in ("bot-1", "other"):
            api.patch("v1", "Pod", name, {"status": {"phase": "Running"}}, "default", subresource="status")
        # No parameter in the namespace (parameterNotFoundAction Allow): RBAC alone decides; the bot holds no exec.
        with pytest.raises(ApiException, match="403"):
            exec_as_bot(api, "other")
        api.apply(EXEC_RIGHTS)
        assert exec_as_bot(api, "other") == "hi\n"
        api.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "p", "namespace": "default",
                   "labels": {"policy": "only-own"}},
                   "data": {"user": "system:serviceaccount:default:bot", "prefix": "bot-"}})
        assert exec_as_bot(api, "bot-1") == "hi\n"
        with pytest.raises(ApiException, match="422") as refused:
            exec_as_bot(api, "other")
        # The handshake's Status body, as the client quotes it.
        text = str(refused.value)
        assert '"reason": "Invalid"' in text and 'is forbidden: ValidatingAdmissionPolicy' in text
        assert "'only-own' with binding 'only-own-binding' denied request: the bot execs only into its own Pods" in text
        # A validation without a message reports its expression; other users' creates and deletes are checked too.
        with pytest.raises(KubeApiError) as kept:
            api.delete("v1", "Pod", "keep", "default")
        assert (kept.value.status, kept.value.reason) == (422, "Invalid")
        assert "denied request: failed expression: request.operation != 'DELETE' ||" in kept.value.message
        api.delete("v1", "Pod", "other", "default")
