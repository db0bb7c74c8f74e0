"""The emulator against answers real API servers gave: each case is a message a user pasted from a real cluster
into a public issue (linked), and the request that provokes it, rebuilt with the same names. The emulator must
answer that request with that status and message, word for word.

The other emulator tests quote texts from the Kubernetes source; these check them against what servers printed.
A real server cannot run here (no kube-apiserver binary can be installed), so the recordings are the next best
witness. Only recordings whose text Kubernetes 1.33 still prints are used (kubectl's own `The ... is invalid`
prefix and line wrapping removed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.kube import KubeApi, running_emulator

NS = "default"


@dataclass(frozen=True)
class Recorded:
    source: str  # where the server's answer was recorded
    path: str  # the collection the object is created in
    body: dict[str, Any]
    status: int
    message: str
    strict: bool = False  # sent with fieldValidation=Strict (kubectl's default since 1.27)


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec}}


def deployment(name: str, labels: dict[str, str], selector: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": selector or labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec}}}}


PODS = f"/api/v1/namespaces/{NS}/pods"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
GPU_TOLERATION_SECONDS = {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Equal", "tolerationSeconds": 0,
                          "value": "true"}

CASES = {
    "toleration Exists with a value": Recorded(
        "https://github.com/kubernetes/kubernetes/pull/128119 (the text from 1.32 on)", PODS,
        pod("test", tolerations=[{"key": "pool", "operator": "Exists", "value": "build", "effect": "NoSchedule"}]),
        422, 'Pod "test" is invalid: spec.tolerations[0].operator: Invalid value: "build": value must be empty when '
             "`operator` is 'Exists'"),
    "tolerationSeconds without NoExecute": Recorded(
        "https://github.com/minio/operator/issues/1298", PODS,
        pod("test-pool-0-3", tolerations=[GPU_TOLERATION_SECONDS]),
        422, 'Pod "test-pool-0-3" is invalid: spec.tolerations[0].effect: Invalid value: "NoSchedule": effect must be '
             "'NoExecute' when `tolerationSeconds` is set"),
    "toleration with no key and no operator": Recorded(
        "https://github.com/rancher/rancher/issues/45838", DEPLOYMENTS,
        deployment("cattle-cluster-agent", {"app": "cattle-cluster-agent"}, tolerations=[{"effect": "NoSchedule"}]),
        422, 'Deployment.apps "cattle-cluster-agent" is invalid: spec.template.spec.tolerations[0].operator: Invalid '
             'value: "": operator must be Exists when `key` is empty, which means "match all values and all keys"'),
    "request above limit": Recorded(
        "https://github.com/openshift/ci-tools/pull/4936", PODS,
        pod("measured", containers=[{"name": "main", "image": "busybox",
                                     "resources": {"requests": {"cpu": "3"}, "limits": {"cpu": "2"}}}]),
        422, 'Pod "measured" is invalid: spec.containers[0].resources.requests: Invalid value: "3": must be less than '
             "or equal to cpu limit of 2"),
    "selector not matching the template": Recorded(
        "https://github.com/replicatedhq/kots-sentry/pull/3", DEPLOYMENTS,
        deployment("sentry-cron", {"app": "sentry", "role": "cron"}, selector={"app": "sentry-cron"}),
        422, 'Deployment.apps "sentry-cron" is invalid: spec.template.metadata.labels: Invalid value: '
             'map[string]string{"app":"sentry", "role":"cron"}: `selector` does not match template `labels`'),
    "annotations above 256 KiB": Recorded(
        "https://github.com/open-telemetry/opentelemetry-demo/issues/2166 (k3s v1.32.3)", f"/api/v1/namespaces/{NS}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "grafana-dashboards",  # kubectl apply's last-applied-configuration of a big dashboard
                      "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 300_000 + "}"}}},
        422, 'ConfigMap "grafana-dashboards" is invalid: metadata.annotations: Too long: may not be more than 262144 bytes'),
    "request body above 3 MiB": Recorded(
        "https://github.com/kubernetes/kubernetes/issues/105863", f"/api/v1/namespaces/{NS}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"blob": "x" * (3 * 2**20)}},
        413, "Request entity too large: limit is 3145728"),
    "a stored object above etcd's 1.5 MiB": Recorded(
        "https://github.com/kubernetes/kubernetes/issues/74600 (the Status body; #112152: still a 500)",
        f"/apis/platformapi.kubeplus/v1alpha1/namespaces/{NS}/helloworldservices",
        {"apiVersion": "platformapi.kubeplus/v1alpha1", "kind": "HelloWorldService", "metadata": {"name": "big"},
         "spec": {"greeting": "x" * (1536 * 1024)}},
        500, "etcdserver: request is too large"),
    "unknown field under strict validation": Recorded(
        "https://github.com/zakkg3/ClusterSecret/issues/51", DEPLOYMENTS,
        {**deployment("clustersecret", {"app": "clustersecret"}),
         "spec": {**deployment("clustersecret", {"app": "clustersecret"})["spec"], "matchLabels": {"app": "clustersecret"}}},
        400, 'Deployment in version "v1" cannot be handled as a Deployment: strict decoding error: unknown field '
             '"spec.matchLabels"', strict=True),
    "unknown field in a custom resource under strict validation": Recorded(
        "https://github.com/cloud-ark/kubeplus/issues/1381", f"/apis/platformapi.kubeplus/v1alpha1/namespaces/{NS}/helloworldservices",
        {"apiVersion": "platformapi.kubeplus/v1alpha1", "kind": "HelloWorldService", "metadata": {"name": "hs1"},
         "spec": {"greeting": "hello", "replicas": 1}},
        400, 'HelloWorldService in version "v1alpha1" cannot be handled as a HelloWorldService: strict decoding error: '
             'unknown field "spec.replicas"', strict=True),
}

HELLO_WORLD_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "helloworldservices.platformapi.kubeplus"},
    "spec": {"group": "platformapi.kubeplus", "scope": "Namespaced",
             "names": {"plural": "helloworldservices", "singular": "helloworldservice", "kind": "HelloWorldService"},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object",
                 "properties": {"spec": {"type": "object", "properties": {"greeting": {"type": "string"}}}}}}}]},
}


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_the_emulator_answers_as_a_real_server_answered(kube_api: KubeApi, case: Recorded) -> None:
    kube_api.apply(HELLO_WORLD_CRD)
    params = {"fieldValidation": "Strict"} if case.strict else {}
    answer = httpx.post(f"{kube_api.url}{case.path}", json=case.body, params=params, timeout=10)
    status = answer.json()
    assert (answer.status_code, status.get("kind"), status.get("code")) == (case.status, "Status", case.status), status
    assert status["message"] == case.message, case.source


@dataclass(frozen=True)
class RecordedRefusal:
    """A request a ServiceAccount sent to a server with RBAC, and the refusal the server answered."""

    source: str
    namespace: str
    account: str
    method: str
    path: str
    message: str
    body: dict[str, Any] | None = None
    details: dict[str, Any] | None = None  # the Status's details, where the recording shows them


def secret_owned_by_job(name: str, job: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "ownerReferences": [
        {"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
         "controller": True, "blockOwnerDeletion": True}]}, "stringData": {"token": "x"}}


X2A_SECRET = "x2a-job-secret-init-2bbdf196-34c8-41dd-a17e-9b24c1df38f3"
REFUSALS = {
    "list at the cluster scope": RecordedRefusal(
        "https://github.com/k0rdent/kcm/issues/1710 (client-go 0.33)", "kcm-system", "kcm-controller-manager",
        "GET", "/api/v1/configmaps",
        'configmaps is forbidden: User "system:serviceaccount:kcm-system:kcm-controller-manager" cannot list resource '
        '"configmaps" in API group "" at the cluster scope'),
    "list in a namespace": RecordedRefusal(
        "https://github.com/caddyserver/ingress/issues/61", "caddy-system", "caddy-ingress-controller",
        "GET", "/api/v1/namespaces/caddy-system/configmaps",
        'configmaps is forbidden: User "system:serviceaccount:caddy-system:caddy-ingress-controller" cannot list '
        'resource "configmaps" in API group "" in the namespace "caddy-system"'),
    "get by name": RecordedRefusal(
        "https://github.com/ministryofjustice/cloud-platform-environments/issues/3145", "hmpps-ems-dev", "github-actions",
        "GET", "/api/v1/namespaces/hmpps-ems-dev/configmaps/grafana-dev",
        'configmaps "grafana-dev" is forbidden: User "system:serviceaccount:hmpps-ems-dev:github-actions" cannot get '
        'resource "configmaps" in API group "" in the namespace "hmpps-ems-dev"'),
    "blockOwnerDeletion without the owner's finalizers": RecordedRefusal(
        "https://github.com/redhat-developer/rhdh-plugins/pull/2757 (the whole Status body)", "x2a", "x2a-backend",
        "POST", "/api/v1/namespaces/x2a/secrets",
        f'secrets "{X2A_SECRET}" is forbidden: cannot set blockOwnerDeletion if an ownerReference refers to a '
        "resource you can't set finalizers on: , <nil>",
        details={"name": X2A_SECRET, "kind": "secrets"}),
}


@pytest.mark.parametrize("case", REFUSALS.values(), ids=list(REFUSALS))
def test_the_emulator_refuses_as_a_real_server_with_rbac_refused(tmp_path: Path, case: RecordedRefusal) -> None:
    from tests.kube_emulator.authz import service_account

    with running_emulator(tmp_path, {"sa-token": service_account(case.namespace, case.account)}) as admin:
        admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": case.namespace}})
        # The account may create Secrets (the blockOwnerDeletion case's own right), nothing else.
        admin.apply([{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                      "metadata": {"name": "secret-writer", "namespace": case.namespace},
                      "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]},
                     {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                      "metadata": {"name": "secret-writer", "namespace": case.namespace},
                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "secret-writer"},
                      "subjects": [{"kind": "ServiceAccount", "name": case.account, "namespace": case.namespace}]}])
        body = case.body
        if case.method == "POST":
            job = admin.apply({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x2a-init",
                                                                                    "namespace": case.namespace},
                               "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                                   {"name": "main", "image": "busybox"}]}}}})[0]
            body = secret_owned_by_job(X2A_SECRET, job)
        answer = httpx.request(case.method, f"{admin.url}{case.path}", json=body, timeout=10,
                               headers={"Authorization": "Bearer sa-token"})
        status = answer.json()
        assert (answer.status_code, status["kind"], status["reason"]) == (403, "Status", "Forbidden"), status
        assert status["message"] == case.message, case.source
        if case.details is not None:
            assert status["details"] == case.details
        unknown = httpx.get(f"{admin.url}{case.path}", headers={"Authorization": "Bearer another"}, timeout=10)
        assert (unknown.status_code, unknown.json()["reason"]) == (401, "Unauthorized")
