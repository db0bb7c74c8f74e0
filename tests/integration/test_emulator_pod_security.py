"""The emulator applies Pod Security admission by namespace label as a real API server does: `enforce` refuses a
violating Pod with 403 and the server's text (the example in the Kubernetes docs, "Pod Security Admission"),
`warn` answers Pods and workload templates with a Warning header, and a workload is never refused for its
template (its Pods would be)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fixtures.kube import KubeApi
from tests.kube_emulator import pod_security

RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
RESTRICTED_POD = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def pod(name: str, pod_context: dict[str, Any] | None = None, **container_context: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": name}
    if container_context:
        container["securityContext"] = container_context
    spec: dict[str, Any] = {"containers": [container]}
    if pod_context:
        spec["securityContext"] = pod_context
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def restricted(kube_api: KubeApi) -> str:
    kube_api.apply(namespace("tenant", **{pod_security.ENFORCE: "restricted", pod_security.WARN: "restricted"}))
    return kube_api.url + "/api/v1/namespaces/tenant/pods"


def test_enforce_restricted_refuses_a_plain_pod_with_the_servers_message(kube_api: KubeApi, restricted: str) -> None:
    refused = httpx.post(restricted, json=pod("nginx"))
    assert refused.status_code == 403
    assert refused.json()["reason"] == "Forbidden"
    # Verbatim from kubernetes.io/docs/concepts/security/pod-security-admission (kubectl's "Error from server").
    assert refused.json()["message"] == (
        'pods "nginx" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
        '(container "nginx" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities '
        '(container "nginx" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or '
        'container "nginx" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container "nginx" '
        'must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")')
    assert kube_api.get("v1", "Pod", "nginx", "tenant") is None


def test_a_restricted_pod_is_accepted_without_warnings(kube_api: KubeApi, restricted: str) -> None:
    accepted = httpx.post(restricted, json=pod("ok", RESTRICTED_POD, **RESTRICTED_CONTAINER))
    assert accepted.status_code == 201 and "Warning" not in accepted.headers
    # Per container settings count as the pod's; runAsUser 0 and an added capability do not pass.
    root = pod("root", RESTRICTED_POD | {"runAsUser": 0}, **RESTRICTED_CONTAINER)
    assert "runAsUser=0 (pod must not set runAsUser=0)" in httpx.post(restricted, json=root).json()["message"]
    admin = pod("admin", RESTRICTED_POD, **RESTRICTED_CONTAINER | {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}})
    assert 'container "admin" must not include "SYS_ADMIN" in securityContext.capabilities.add' in (
        httpx.post(restricted, json=admin).json()["message"])


def test_baseline_refuses_privileged_and_host_paths_but_not_what_only_restricted_forbids(kube_api: KubeApi) -> None:
    kube_api.apply(namespace("team", **{pod_security.ENFORCE: "baseline"}))
    url = kube_api.url + "/api/v1/namespaces/team/pods"
    assert httpx.post(url, json=pod("plain")).status_code == 201
    privileged = httpx.post(url, json=pod("priv", privileged=True))
    assert privileged.status_code == 403
    assert 'violates PodSecurity "baseline:latest": privileged (container "priv" must not set ' \
           'securityContext.privileged=true)' in privileged.json()["message"]
    host = pod("host")
    host["spec"]["volumes"] = [{"name": "root", "hostPath": {"path": "/"}}]
    assert "hostPath volumes" in httpx.post(url, json=host).json()["message"]


def test_workloads_are_accepted_and_warned_about_their_templates(kube_api: KubeApi, restricted: str) -> None:
    template = pod("web")
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                  "spec": {"selector": {"matchLabels": {"app": "web"}},
                           "template": {"metadata": {"labels": {"app": "web"}}, "spec": template["spec"]}}}
    created = httpx.post(kube_api.url + "/apis/apps/v1/namespaces/tenant/deployments", json=deployment)
    assert created.status_code == 201
    assert created.headers["Warning"].startswith('299 - "would violate PodSecurity \\"restricted:latest\\": '
                                                 'allowPrivilegeEscalation != false')
    # Without labels a namespace is privileged: nothing is checked.
    quiet = httpx.post(kube_api.url + "/apis/apps/v1/namespaces/default/deployments", json=deployment)
    assert quiet.status_code == 201 and "Warning" not in quiet.headers


def test_pod_level_settings_cover_every_container_and_init_container() -> None:
    spec = pod("a", RESTRICTED_POD, **RESTRICTED_CONTAINER)["spec"]
    assert pod_security.violations("restricted", spec) == []
    spec["initContainers"] = [{"name": "init", "image": "busybox"}]
    assert pod_security.violations("restricted", spec) == [
        'allowPrivilegeEscalation != false (container "init" must set securityContext.allowPrivilegeEscalation=false)',
        'unrestricted capabilities (container "init" must set securityContext.capabilities.drop=["ALL"])',
    ]
