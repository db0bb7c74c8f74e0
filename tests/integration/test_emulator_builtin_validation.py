"""The emulator answers bad built-in objects and bad bodies over HTTP as a real API server does: 422 Invalid
with a Status body and the server's message, 400 for what cannot be decoded, Warning headers for unknown fields
and 400 for them under `fieldValidation=Strict`. The texts are those of a 1.33 API server (see
tests/unit/test_emulator_builtin_rules.py for the source functions)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.fixtures.kube import KubeApi
from tests.kube_emulator.samples import GROUP, PLURAL, widget, widget_crd

STS_URL = "/apis/apps/v1/namespaces/default/statefulsets"


def statefulset(name: str = "web", **container: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, "serviceName": name,
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "main", "image": "busybox", **container}]}}}}


def test_a_refused_child_is_a_422_status_with_the_servers_message(kube_api: KubeApi) -> None:
    apps = client.AppsV1Api(kube_api.client())
    bad = statefulset(resources={"requests": {"cpu": "2"}, "limits": {"cpu": "1"}})
    with pytest.raises(ApiException) as caught:
        apps.create_namespaced_stateful_set("default", bad)
    status = json.loads(caught.value.body)
    assert caught.value.status == 422
    assert status["kind"] == "Status" and status["status"] == "Failure" and status["reason"] == "Invalid"
    assert status["message"] == ('StatefulSet.apps "web" is invalid: spec.template.spec.containers[0].resources.requests: '
                                 'Invalid value: "2": must be less than or equal to cpu limit of 1')
    assert status["details"]["causes"] == [{"field": "spec.template.spec.containers[0].resources.requests",
                                            "reason": "FieldValueInvalid",
                                            "message": 'Invalid value: "2": must be less than or equal to cpu limit of 1'}]
    assert kube_api.get("apps/v1", "StatefulSet", "web", "default") is None


def test_two_violations_are_listed_in_brackets(kube_api: KubeApi) -> None:
    bad = statefulset(resources={"limits": {"memory": "-1"}})
    bad["spec"]["template"]["spec"]["tolerations"] = [{"key": "k", "operator": "Equal", "value": "v", "tolerationSeconds": 3}]
    response = httpx.post(kube_api.url + STS_URL, json=bad)
    assert response.status_code == 422
    assert response.json()["message"] == (
        'StatefulSet.apps "web" is invalid: [spec.template.spec.containers[0].resources.limits[memory]: Invalid value: '
        '"-1": must be greater than or equal to 0, spec.template.spec.tolerations[0].effect: Invalid value: "": '
        "effect must be 'NoExecute' when `tolerationSeconds` is set]")


def test_an_update_that_breaks_a_rule_is_refused_and_leaves_the_object(kube_api: KubeApi) -> None:
    kube_api.apply(statefulset())
    response = httpx.patch(kube_api.url + STS_URL + "/web", headers={"Content-Type": "application/merge-patch+json"},
                           json={"spec": {"template": {"spec": {"runtimeClassName": "Kata_Containers"}}}})
    assert response.status_code == 422
    assert response.json()["message"].startswith(
        'StatefulSet.apps "web" is invalid: spec.template.spec.runtimeClassName: Invalid value: "Kata_Containers": '
        "a lowercase RFC 1123 subdomain")
    stored = kube_api.get("apps/v1", "StatefulSet", "web", "default")
    assert stored is not None and "runtimeClassName" not in stored["spec"]["template"]["spec"]


def test_a_value_of_the_wrong_type_is_400_bad_request(kube_api: KubeApi) -> None:
    bad = statefulset(resources={"limits": {"cpu": "two"}})
    response = httpx.post(kube_api.url + STS_URL, json=bad)
    assert response.status_code == 400
    assert response.json()["reason"] == "BadRequest"
    assert response.json()["message"] == (
        'StatefulSet in version "v1" cannot be handled as a StatefulSet: quantities must match the regular '
        "expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")


def test_unknown_fields_warn_by_default_and_fail_under_strict(kube_api: KubeApi) -> None:
    typo = statefulset(resourcez={"limits": {"cpu": "1"}})
    strict = httpx.post(kube_api.url + STS_URL + "?fieldValidation=Strict", json=typo)
    assert strict.status_code == 400
    assert strict.json()["message"] == ('StatefulSet in version "v1" cannot be handled as a StatefulSet: strict decoding '
                                        'error: unknown field "spec.template.spec.containers[0].resourcez"')
    warned = httpx.post(kube_api.url + STS_URL, json=typo)
    assert warned.status_code == 201
    assert warned.headers["Warning"] == '299 - "unknown field \\"spec.template.spec.containers[0].resourcez\\""'
    assert "resourcez" not in warned.json()["spec"]["template"]["spec"]["containers"][0]
    ignored = httpx.post(kube_api.url + STS_URL + "?fieldValidation=Ignore", json=statefulset("other", resourcez={}))
    assert ignored.status_code == 201 and "Warning" not in ignored.headers


def test_custom_resources_unknown_fields_integral_floats_and_go_patterns(kube_api: KubeApi) -> None:
    kube_api.apply(widget_crd())
    url = f"{kube_api.url}/apis/{GROUP}/v1/namespaces/default/{PLURAL}"
    typo = widget("w", size=8)
    typo["spec"]["sise"] = 8
    strict = httpx.post(url + "?fieldValidation=Strict", json=typo)
    assert strict.status_code == 400
    assert strict.json()["message"] == ('Widget in version "v1" cannot be handled as a Widget: strict decoding error: '
                                        'unknown field "spec.sise"')
    warned = httpx.post(url, json=typo)
    assert warned.headers["Warning"] == '299 - "unknown field \\"spec.sise\\""'
    assert "sise" not in warned.json()["spec"]
    # An integral float is an integer (and stored as one); a pattern's `$` does not match before a newline.
    created = httpx.post(url, json=widget("w2", size=8.0))
    assert created.status_code == 201 and created.json()["spec"]["size"] == 8 and "8.0" not in created.text
    newline = httpx.post(url, json=widget("w3", size=8, model="abc\n"))
    assert newline.status_code == 422
    assert newline.json()["message"] == ('Widget.example.harnessrl.io "w3" is invalid: spec.model: Invalid value: "abc\\n": '
                                         "spec.model in body should match '^[a-z0-9-]*$'")


def test_labels_of_custom_resources_are_checked_too(kube_api: KubeApi) -> None:
    kube_api.apply(widget_crd())
    bad = widget("w", size=8)
    bad["metadata"]["labels"] = {"team": "ml platform"}
    response = httpx.post(f"{kube_api.url}/apis/{GROUP}/v1/namespaces/default/{PLURAL}", json=bad)
    assert response.status_code == 422
    assert response.json()["message"].startswith(
        'Widget.example.harnessrl.io "w" is invalid: metadata.labels: Invalid value: "ml platform": a valid label must')


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json(kube_api: KubeApi, constant: str) -> None:
    body = json.dumps(statefulset()).replace('"serviceName": "web"', f'"serviceName": "web", "replicas": {constant}')
    response = httpx.post(kube_api.url + STS_URL, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["message"] == (f"couldn't get version/kind; json parse error: invalid character "
                                          f"'{constant.lstrip('-')[0]}' looking for beginning of value")
    kube_api.apply(statefulset())
    patched = httpx.patch(kube_api.url + STS_URL + "/web", content='{"spec": {"replicas": NaN}}',
                          headers={"Content-Type": "application/merge-patch+json"})
    assert patched.status_code == 400
