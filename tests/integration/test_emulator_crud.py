"""The Kubernetes API emulator, driven by the official `kubernetes` client over HTTP: discovery, CRUD,
metadata bookkeeping, concurrency, subresources and patch flavours.

The emulator is a stand-in for a real API server (see tests/kube_emulator/README.md for what it does not do).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.fixtures.kube import KubeApi


def _status(e: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(e.body)
    return body


def _deployment(name: str, replicas: int = 1) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "main", "image": "busybox:1"},
                                                      {"name": "side", "image": "busybox:1"}]}}},
    }


def test_discovery_lists_the_builtin_groups_and_resources(kube_api: KubeApi) -> None:
    api = kube_api.client()
    assert client.CoreApi(api).get_api_versions().versions == ["v1"]
    groups = {g.name: g.preferred_version.version for g in client.ApisApi(api).get_api_versions().groups}
    for group in ("apps", "batch", "networking.k8s.io", "rbac.authorization.k8s.io", "coordination.k8s.io",
                  "apiextensions.k8s.io"):
        assert groups[group] == "v1"
    core = {r.name: r for r in client.CoreV1Api(api).get_api_resources().resources}
    assert {"pods", "services", "configmaps", "secrets", "serviceaccounts", "events", "persistentvolumeclaims",
            "namespaces", "pods/status"} <= set(core)
    assert core["namespaces"].namespaced is False and core["pods"].namespaced is True
    apps = {r.name: r.kind for r in client.AppsV1Api(api).get_api_resources().resources}
    assert apps["deployments/scale"] == "Scale"
    assert client.VersionApi(api).get_code().major == "1"


def test_create_sets_server_metadata_and_rejects_duplicates(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    body = {"metadata": {"name": "cfg", "labels": {"a": "1"}}, "data": {"k": "v"}}
    first = core.create_namespaced_config_map("default", body)
    second = core.create_namespaced_config_map("default", {"metadata": {"name": "cfg2"}})
    assert first.metadata.uid and first.metadata.uid != second.metadata.uid
    assert first.metadata.creation_timestamp is not None
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    with pytest.raises(ApiException) as conflict:
        core.create_namespaced_config_map("default", body)
    assert conflict.value.status == 409
    assert _status(conflict.value)["reason"] == "AlreadyExists"
    assert _status(conflict.value)["message"] == 'configmaps "cfg" already exists'
    listed = core.list_namespaced_config_map("default")
    assert [c.metadata.name for c in listed.items] == ["cfg", "cfg2"]
    assert int(listed.metadata.resource_version) >= int(second.metadata.resource_version)
    generated = core.create_namespaced_config_map("default", {"metadata": {"generateName": "gen-"}})
    assert generated.metadata.name.startswith("gen-") and len(generated.metadata.name) == 9


def test_missing_object_is_404_with_a_status_body(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_secret("nope", "default")
    status = _status(missing.value)
    assert missing.value.status == 404
    assert status["kind"] == "Status" and status["reason"] == "NotFound"
    assert status["message"] == 'secrets "nope" not found'
    with pytest.raises(ApiException) as no_namespace:
        core.create_namespaced_secret("absent", {"metadata": {"name": "s"}})
    assert no_namespace.value.status == 404
    assert _status(no_namespace.value)["message"] == 'namespaces "absent" not found'


def test_invalid_names_are_rejected(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    with pytest.raises(ApiException) as bad:
        core.create_namespaced_config_map("default", {"metadata": {"name": "Not_Valid"}})
    assert bad.value.status == 422
    assert 'ConfigMap "Not_Valid" is invalid: metadata.name: Invalid value: "Not_Valid"' in _status(bad.value)["message"]


def test_update_requires_the_current_resource_version(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    created = core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}, "data": {"k": "1"}})
    created.data = {"k": "2"}
    updated = core.replace_namespaced_config_map("cfg", "default", created)
    assert updated.data == {"k": "2"}
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)
    created.data = {"k": "3"}  # still carries the old resourceVersion
    with pytest.raises(ApiException) as stale:
        core.replace_namespaced_config_map("cfg", "default", created)
    assert stale.value.status == 409
    assert "the object has been modified" in _status(stale.value)["message"]
    # A merge patch carrying a resourceVersion is a precondition too.
    with pytest.raises(ApiException) as stale_patch:
        core.patch_namespaced_config_map("cfg", "default", {"metadata": {"resourceVersion": created.metadata.resource_version}})
    assert stale_patch.value.status == 409


def test_generation_bumps_on_spec_changes_only(kube_api: KubeApi) -> None:
    apps = client.AppsV1Api(kube_api.client())
    created = apps.create_namespaced_deployment("default", _deployment("web"))
    assert created.metadata.generation == 1
    labelled = apps.patch_namespaced_deployment("web", "default", {"metadata": {"labels": {"x": "y"}}})
    assert labelled.metadata.generation == 1
    status = apps.patch_namespaced_deployment_status("web", "default", {"status": {"replicas": 1, "observedGeneration": 1}})
    assert status.metadata.generation == 1 and status.status.replicas == 1
    scaled = apps.patch_namespaced_deployment("web", "default", {"spec": {"replicas": 3}})
    assert scaled.metadata.generation == 2
    # Writes to the main resource leave status alone, status writes leave spec alone.
    ignored = apps.patch_namespaced_deployment("web", "default", {"status": {"replicas": 7}})
    assert ignored.status.replicas == 1 and ignored.metadata.generation == 2
    spec_ignored = apps.patch_namespaced_deployment_status("web", "default", {"spec": {"replicas": 9}})
    assert spec_ignored.spec.replicas == 3
    # A write that changes nothing keeps the resourceVersion.
    again = apps.patch_namespaced_deployment("web", "default", {"spec": {"replicas": 3}})
    assert again.metadata.resource_version == spec_ignored.metadata.resource_version


def test_scale_subresource_reads_and_writes_replicas(kube_api: KubeApi) -> None:
    apps = client.AppsV1Api(kube_api.client())
    apps.create_namespaced_stateful_set("default", {**_deployment("db", replicas=2), "kind": "StatefulSet"})
    scale = apps.read_namespaced_stateful_set_scale("db", "default")
    assert scale.spec.replicas == 2 and scale.status.selector == "app=db"
    apps.patch_namespaced_stateful_set_scale("db", "default", {"spec": {"replicas": 5}})
    sts = apps.read_namespaced_stateful_set("db", "default")
    assert sts.spec.replicas == 5 and sts.metadata.generation == 2


def test_json_patch_with_a_failing_test_op_is_422(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}, "data": {"k": "1"}})
    patched = core.patch_namespaced_config_map("cfg", "default", [
        {"op": "test", "path": "/data/k", "value": "1"}, {"op": "replace", "path": "/data/k", "value": "2"}])
    assert patched.data == {"k": "2"}
    with pytest.raises(ApiException) as failed:
        core.patch_namespaced_config_map("cfg", "default", [
            {"op": "test", "path": "/data/k", "value": "1"}, {"op": "replace", "path": "/data/k", "value": "3"}])
    assert failed.value.status == 422
    assert _status(failed.value)["reason"] == "Invalid"
    assert core.read_namespaced_config_map("cfg", "default").data == {"k": "2"}


def test_strategic_merge_patch_merges_containers_by_name(kube_api: KubeApi) -> None:
    apps = client.AppsV1Api(kube_api.client())  # the client sends dict patches as strategic merge patches
    apps.create_namespaced_deployment("default", _deployment("web"))
    patched = apps.patch_namespaced_deployment("web", "default", {
        "spec": {"template": {"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}}})
    containers = {c.name: c.image for c in patched.spec.template.spec.containers}
    assert containers == {"main": "busybox:2", "side": "busybox:1"}
    deleted = apps.patch_namespaced_deployment("web", "default", {
        "spec": {"template": {"spec": {"containers": [{"name": "side", "$patch": "delete"}]}}}})
    assert [c.name for c in deleted.spec.template.spec.containers] == ["main"]


def test_cluster_scoped_objects_and_namespace_deletion(kube_api: KubeApi) -> None:
    api = kube_api.client()
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    rbac.create_cluster_role({"metadata": {"name": "reader"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})
    assert rbac.read_cluster_role("reader").metadata.namespace is None
    core.create_namespace({"metadata": {"name": "team"}})
    core.create_namespaced_service_account("team", {"metadata": {"name": "bot"}})
    core.create_namespaced_config_map("team", {"metadata": {"name": "held", "finalizers": ["example.com/hold"]}})
    core.delete_namespace("team")
    assert core.read_namespace("team").status.phase == "Terminating"
    assert core.list_namespaced_service_account("team").items == []
    with pytest.raises(ApiException) as closed:
        core.create_namespaced_config_map("team", {"metadata": {"name": "late"}})
    assert closed.value.status == 403
    core.patch_namespaced_config_map("held", "team", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as gone:
        core.read_namespace("team")
    assert gone.value.status == 404


def test_events_can_be_posted(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    core.create_namespaced_event("default", {
        "metadata": {"name": "ev.1"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "Tested", "message": "hello", "type": "Normal"})
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=p").items
    assert [e.message for e in events] == ["hello"]


def test_list_pagination(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    for n in range(5):
        core.create_namespaced_config_map("default", {"metadata": {"name": f"cm-{n}"}})
    first = core.list_namespaced_config_map("default", limit=2)
    assert [c.metadata.name for c in first.items] == ["cm-0", "cm-1"]
    assert first.metadata.remaining_item_count == 3
    rest = core.list_namespaced_config_map("default", limit=10, _continue=first.metadata._continue)
    assert [c.metadata.name for c in rest.items] == ["cm-2", "cm-3", "cm-4"]


def test_fixture_helpers_apply_get_and_kubeconfig(kube_api: KubeApi) -> None:
    applied = kube_api.apply("""
apiVersion: v1
kind: ConfigMap
metadata: {name: one}
data: {k: v}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: one}
data: {k: w}
""")
    assert applied[1]["data"] == {"k": "w"} and applied[1]["metadata"]["uid"] == applied[0]["metadata"]["uid"]
    assert (kube_api.get("v1", "ConfigMap", "one", "default") or {})["data"] == {"k": "w"}
    assert kube_api.get("v1", "ConfigMap", "two", "default") is None
    assert [c["metadata"]["name"] for c in kube_api.list_objects("v1", "ConfigMap", "default")] == ["one"]
    assert kube_api.url in kube_api.kubeconfig_path.read_text()
    from kubernetes import config

    loaded = client.Configuration()
    config.load_kube_config(config_file=str(kube_api.kubeconfig_path), client_configuration=loaded)
    names = [n.metadata.name for n in client.CoreV1Api(client.ApiClient(loaded)).list_namespace().items]
    assert "default" in names


def test_faults_can_be_injected_with_kmocks_dsl(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}})
    # kmock reactions a test declares take precedence over the emulator; `[:1]` makes this one fire once.
    kube_api.emulator["get /api/v1/namespaces/default/configmaps/cfg"][:1] << 503
    with pytest.raises(ApiException) as unavailable:
        core.read_namespaced_config_map("cfg", "default")
    assert unavailable.value.status == 503
    assert core.read_namespaced_config_map("cfg", "default").metadata.name == "cfg"


def test_builtin_kinds_get_server_side_status_defaults_and_immutability(kube_api: KubeApi) -> None:
    api = kube_api.client()
    core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
    pod = core.create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "a"}]},
                                                 "status": {"phase": "Running"}})
    assert pod.status.phase == "Pending"
    svc = core.create_namespaced_service("default", {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}})
    assert svc.spec.cluster_ip.startswith("10.96.")
    allocated = svc.spec.cluster_ip
    svc.spec.cluster_ip, svc.spec.cluster_ips = None, None  # an update that leaves it out keeps it
    assert core.replace_namespaced_service("s", "default", svc).spec.cluster_ip == allocated
    with pytest.raises(ApiException) as fixed_ip:
        core.patch_namespaced_service("s", "default", {"spec": {"clusterIP": "10.96.9.9"}})
    assert _status(fixed_ip.value)["message"].endswith('spec.clusterIP: Invalid value: "10.96.9.9": field is immutable')
    secret = core.create_namespaced_secret("default", {"metadata": {"name": "t"}, "stringData": {"token": "abc"}})
    assert secret.data == {"token": "YWJj"} and secret.string_data is None
    sts = _deployment("db") | {"kind": "StatefulSet"}
    sts["spec"]["volumeClaimTemplates"] = [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]
    apps.create_namespaced_stateful_set("default", sts)
    apps.patch_namespaced_stateful_set("db", "default", {"spec": {"replicas": 2}})
    with pytest.raises(ApiException) as forbidden:
        apps.patch_namespaced_stateful_set("db", "default", {"spec": {"serviceName": "other"}})
    assert forbidden.value.status == 422
    assert "updates to statefulset spec for fields other than 'replicas'" in _status(forbidden.value)["message"]
    batch.create_namespaced_job("default", {"metadata": {"name": "j"}, "spec": {"template": {"spec": {
        "restartPolicy": "Never", "containers": [{"name": "c", "image": "a"}]}}}})
    with pytest.raises(ApiException) as immutable:
        batch.patch_namespaced_job("j", "default", {"spec": {"template": {"spec": {"restartPolicy": "OnFailure"}}}})
    assert _status(immutable.value)["message"] == 'Job.batch "j" is invalid: spec.template: Invalid value: "object": field is immutable'
    # A suspended Job that has not started may change where its Pods go (Kueue's admission), nothing else.
    batch.create_namespaced_job("default", {"metadata": {"name": "queued"}, "spec": {"suspend": True, "template": {
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "a"}]}}}})
    batch.patch_namespaced_job("queued", "default", {"spec": {"suspend": False, "template": {
        "metadata": {"labels": {"flavor": "h100"}}, "spec": {"nodeSelector": {"gpu": "h100"},
                                                             "tolerations": [{"key": "gpu", "operator": "Exists"}]}}}})
    with pytest.raises(ApiException) as started:  # running now: fixed again
        batch.patch_namespaced_job("queued", "default", {"spec": {"template": {"spec": {"nodeSelector": {"gpu": "a100"}}}}})
    assert started.value.status == 422
    batch.patch_namespaced_job("queued", "default", {"spec": {"suspend": True}})
    batch.patch_namespaced_job_status("queued", "default", {"status": {"startTime": "2026-01-01T00:00:00Z"}})
    with pytest.raises(ApiException) as ran:  # suspended, but started (the controller has not reset startTime)
        batch.patch_namespaced_job("queued", "default", {"spec": {"template": {"spec": {"nodeSelector": {"gpu": "a100"}}}}})
    assert ran.value.status == 422
    with pytest.raises(ApiException) as image:
        batch.patch_namespaced_job("j", "default", {"spec": {"suspend": True}})
        batch.patch_namespaced_job("j", "default", {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "b"}]}}}})
    assert "spec.template" in _status(image.value)["message"]


def test_server_side_apply_creates_then_merges(kube_api: KubeApi) -> None:
    """Apply is emulated as create-or-merge (no field ownership: see the emulator's README)."""
    core = client.CoreV1Api(kube_api.client())
    apply = "application/apply-patch+yaml"
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"a": "1"}}
    created = core.patch_namespaced_config_map("applied", "default", body, field_manager="test", _content_type=apply)
    assert created.data == {"a": "1"} and created.metadata.uid
    body["data"] = {"b": "2"}
    merged = core.patch_namespaced_config_map("applied", "default", body, field_manager="test", _content_type=apply)
    assert merged.data == {"a": "1", "b": "2"} and merged.metadata.uid == created.metadata.uid
