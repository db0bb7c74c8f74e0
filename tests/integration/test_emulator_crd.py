"""CustomResourceDefinitions in the Kubernetes API emulator: serving, schema pruning/defaulting/validation
and CEL `x-kubernetes-validations`, with the messages a real API server gives (through the official client)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.fixtures.kube import KubeApi
from tests.kube_emulator.samples import GROUP, PLURAL, widget, widget_crd


def _crs(kube_api: KubeApi) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_api.client())


def _create(kube_api: KubeApi, body: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    created: dict[str, Any] = _crs(kube_api).create_namespaced_custom_object(GROUP, version, "default", PLURAL, body)
    return created


def _rejection(kube_api: KubeApi, body: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as rejected:
        _create(kube_api, body)
    assert rejected.value.status == 422
    status = json.loads(rejected.value.body)
    assert status["kind"] == "Status" and status["reason"] == "Invalid"
    message: str = status["message"]
    return message


@pytest.fixture
def widgets(kube_api: KubeApi) -> KubeApi:
    client.ApiextensionsV1Api(kube_api.client()).create_custom_resource_definition(widget_crd(("v1", "v1beta1")))
    return kube_api


def test_applying_a_crd_serves_its_resource_and_deleting_it_stops(kube_api: KubeApi) -> None:
    api = kube_api.client()
    with pytest.raises(ApiException) as before:
        client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, "v1", "default", PLURAL)
    assert before.value.status == 404
    crd = client.ApiextensionsV1Api(api).create_custom_resource_definition(widget_crd(("v1", "v1beta1")))
    established = {c.type: c.status for c in crd.status.conditions}
    assert established == {"NamesAccepted": "True", "Established": "True"}
    group = client.ApisApi(api).get_api_versions().groups
    served = {g.name: [v.version for v in g.versions] for g in group}
    assert served[GROUP] == ["v1", "v1beta1"]
    resources = httpx.get(f"{kube_api.url}/apis/{GROUP}/v1beta1").json()["resources"]
    assert {r["name"] for r in resources} == {PLURAL, f"{PLURAL}/status", f"{PLURAL}/scale"}
    _create(kube_api, widget("w1"), version="v1beta1")
    as_v1 = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, "v1", "default", PLURAL, "w1")
    assert as_v1["apiVersion"] == f"{GROUP}/v1"  # versions share storage
    client.ApiextensionsV1Api(api).delete_custom_resource_definition(f"{PLURAL}.{GROUP}")
    with pytest.raises(ApiException) as after:
        client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, "v1", "default", PLURAL)
    assert after.value.status == 404
    assert GROUP not in {g.name for g in client.ApisApi(api).get_api_versions().groups}


def test_schema_defaults_and_pruning(widgets: KubeApi) -> None:
    created = _create(widgets, widget("w1", extra={"anything": {"goes": [1]}}, unknown="dropped"))
    spec = created["spec"]
    assert spec["mode"] == "lora" and spec["minReplicas"] == 1 and spec["maxReplicas"] == 4
    assert spec["limits"] == {"cpu": "1"}  # a defaulted object gets its own defaults
    assert "unknown" not in spec
    assert spec["extra"] == {"anything": {"goes": [1]}}  # x-kubernetes-preserve-unknown-fields
    assert created["metadata"]["generation"] == 1


@pytest.mark.parametrize(("spec", "message"), [
    ({"size": 1}, "spec.size: Invalid value: 1: spec.size in body should be greater than or equal to 2"),
    ({"size": 65}, "spec.size: Invalid value: 65: spec.size in body should be less than or equal to 64"),
    ({"size": "big"}, 'spec.size: Invalid value: "string": spec.size in body must be of type integer: "string"'),
    ({"mode": "half"}, 'spec.mode: Unsupported value: "half": supported values: "lora", "full"'),
    ({"model": "Bad_Name"}, "spec.model: Invalid value: \"Bad_Name\": spec.model in body should match '^[a-z0-9-]*$'"),
    ({"model": ""}, 'spec.model: Invalid value: "": spec.model in body should be at least 1 chars long'),
    ({"model": "m" * 21}, "spec.model: Too long: may not be more than 20 bytes"),
    ({"tags": ["a", "b", "c", "d"]}, "spec.tags: Too many: 4: must have at most 3 items"),
    ({"labels": {"a": "1", "b": "2", "c": "3"}}, "spec.labels: Too many: 3: must have at most 2 items"),
])
def test_schema_violations_are_422_with_the_servers_message(widgets: KubeApi, spec: dict[str, Any], message: str) -> None:
    assert _rejection(widgets, widget("w1", **spec)) == f'Widget.{GROUP} "w1" is invalid: {message}'


def test_missing_required_field_and_several_errors(widgets: KubeApi) -> None:
    body = widget("w1")
    del body["spec"]["size"]
    assert _rejection(widgets, body) == f'Widget.{GROUP} "w1" is invalid: spec.size: Required value'
    many = _rejection(widgets, widget("w2", size=1, mode="half"))
    assert many.startswith(f'Widget.{GROUP} "w2" is invalid: [') and "spec.size" in many and "spec.mode" in many


def test_cel_rules_with_message_and_message_expression(widgets: KubeApi) -> None:
    assert _rejection(widgets, widget("w1", minReplicas=5)) == (
        f'Widget.{GROUP} "w1" is invalid: spec: Invalid value: "object": minReplicas must not exceed maxReplicas')
    assert _rejection(widgets, widget("w1", image="img:1", command=["run"])) == (
        f'Widget.{GROUP} "w1" is invalid: spec: Invalid value: "object": set image or command, not both (image: img:1)')


def test_cel_transition_rule_sees_old_self(widgets: KubeApi) -> None:
    crs = _crs(widgets)
    _create(widgets, widget("w1", model="base-a"))
    crs.patch_namespaced_custom_object(GROUP, "v1", "default", PLURAL, "w1", {"spec": {"size": 4}})
    with pytest.raises(ApiException) as immutable:
        crs.patch_namespaced_custom_object(GROUP, "v1", "default", PLURAL, "w1", {"spec": {"model": "base-b"}})
    assert immutable.value.status == 422
    assert json.loads(immutable.value.body)["message"] == f'Widget.{GROUP} "w1" is invalid: spec: Forbidden: model is immutable'
    assert crs.get_namespaced_custom_object(GROUP, "v1", "default", PLURAL, "w1")["spec"]["model"] == "base-a"


def test_custom_resource_status_and_scale_subresources(widgets: KubeApi) -> None:
    crs = _crs(widgets)
    created = _create(widgets, widget("w1", replicas=1, extra={}) | {"status": {"phase": "Ignored"}})
    assert "status" not in created  # create ignores status where it is a subresource
    status = crs.patch_namespaced_custom_object_status(GROUP, "v1", "default", PLURAL, "w1",
                                                       {"status": {"phase": "Running", "replicas": 1}})
    assert status["status"]["phase"] == "Running" and status["metadata"]["generation"] == 1
    with pytest.raises(ApiException) as bad_status:
        crs.patch_namespaced_custom_object_status(GROUP, "v1", "default", PLURAL, "w1", {"status": {"replicas": "x"}})
    assert bad_status.value.status == 422
    crs.patch_namespaced_custom_object_scale(GROUP, "v1", "default", PLURAL, "w1", {"spec": {"replicas": 3}})
    scaled = crs.get_namespaced_custom_object(GROUP, "v1", "default", PLURAL, "w1")
    assert scaled["spec"]["replicas"] == 3 and scaled["metadata"]["generation"] == 2
    assert scaled["status"] == {"phase": "Running", "replicas": 1}
    scale = crs.get_namespaced_custom_object_scale(GROUP, "v1", "default", PLURAL, "w1")
    assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (3, 1)


def test_invalid_crds_are_rejected(kube_api: KubeApi) -> None:
    extensions = client.ApiextensionsV1Api(kube_api.client())
    crd = widget_crd()
    crd["metadata"]["name"] = "wrong.name"
    with pytest.raises(ApiException) as misnamed:
        extensions.create_custom_resource_definition(crd)
    assert misnamed.value.status == 422 and "must be spec.names.plural" in misnamed.value.body
    crd = widget_crd()
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"] = [{"rule": "self.(("}]
    with pytest.raises(ApiException) as bad_rule:
        extensions.create_custom_resource_definition(crd)
    assert bad_rule.value.status == 422 and "compilation failed" in bad_rule.value.body
