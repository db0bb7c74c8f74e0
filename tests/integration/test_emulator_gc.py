"""Finalizers, deletionTimestamp and ownerReference garbage collection in the Kubernetes API emulator."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.fixtures.kube import KubeApi


def _owned_by(*owners: Any) -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": "ConfigMap", "name": o.metadata.name, "uid": o.metadata.uid} for o in owners]


def _exists(core: client.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespaced_config_map(name, "default")
    except ApiException as e:
        assert e.status == 404
        return False
    return True


def test_finalizers_hold_deletion_until_cleared(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    core.create_namespaced_config_map("default", {"metadata": {"name": "held", "finalizers": ["a.example/x", "b.example/y"]}})
    core.delete_namespaced_config_map("held", "default")
    marked = core.read_namespaced_config_map("held", "default")
    assert marked.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as forbidden:
        core.patch_namespaced_config_map("held", "default", {"metadata": {"finalizers": ["a.example/x", "b.example/y", "c.example/z"]}})
    assert forbidden.value.status == 422 and "no new finalizers" in forbidden.value.body
    core.patch_namespaced_config_map("held", "default", {"metadata": {"finalizers": ["b.example/y"]}})
    assert _exists(core, "held")
    core.patch_namespaced_config_map("held", "default", [{"op": "remove", "path": "/metadata/finalizers"}])
    assert not _exists(core, "held")


def test_deleting_an_owner_cascades_to_dependents(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    owner = core.create_namespaced_config_map("default", {"metadata": {"name": "owner"}})
    child = core.create_namespaced_config_map("default", {"metadata": {"name": "child", "ownerReferences": _owned_by(owner)}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "grandchild", "ownerReferences": _owned_by(child)}})
    other = core.create_namespaced_config_map("default", {"metadata": {"name": "other"}})
    shared = core.create_namespaced_config_map("default", {"metadata": {"name": "shared", "ownerReferences": _owned_by(owner, other)}})
    assert shared.metadata.owner_references[1].name == "other"
    core.delete_namespaced_config_map("owner", "default")
    assert not _exists(core, "child") and not _exists(core, "grandchild")
    survivor = core.read_namespaced_config_map("shared", "default")  # it still has a live owner
    assert [r.name for r in survivor.metadata.owner_references] == ["other"]


def test_dependents_wait_for_an_owner_held_by_finalizers(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    owner = core.create_namespaced_config_map("default", {"metadata": {"name": "owner", "finalizers": ["x.example/hold"]}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "child", "ownerReferences": _owned_by(owner)}})
    core.delete_namespaced_config_map("owner", "default")
    assert _exists(core, "child")
    # A strategic merge patch unions finalizers (as on a real server): null clears them.
    core.patch_namespaced_config_map("owner", "default", {"metadata": {"finalizers": None}})
    assert not _exists(core, "owner") and not _exists(core, "child")


def test_orphan_propagation_keeps_dependents(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    owner = core.create_namespaced_config_map("default", {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "child", "ownerReferences": _owned_by(owner)}})
    core.delete_namespaced_config_map("owner", "default", body=client.V1DeleteOptions(propagation_policy="Orphan"))
    orphan = core.read_namespaced_config_map("child", "default")
    assert orphan.metadata.owner_references is None


def test_gc_crosses_kinds_and_delete_preconditions(kube_api: KubeApi) -> None:
    api = kube_api.client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    sts = apps.create_namespaced_stateful_set("default", {
        "metadata": {"name": "db"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "serviceName": "db",
                                             "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "db", "image": "db"}]}}}})
    ref = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": sts.metadata.uid, "controller": True}]
    core.create_namespaced_service("default", {"metadata": {"name": "db", "ownerReferences": ref}, "spec": {"ports": [{"port": 80}]}})
    core.create_namespaced_persistent_volume_claim("default", {"metadata": {"name": "data", "ownerReferences": ref},
                                                              "spec": {"accessModes": ["ReadWriteOnce"]}})
    with pytest.raises(ApiException) as precondition:
        apps.delete_namespaced_stateful_set("db", "default", body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid="not-the-uid")))
    assert precondition.value.status == 409
    apps.delete_namespaced_stateful_set("db", "default", body=client.V1DeleteOptions(propagation_policy="Foreground"))
    assert core.list_namespaced_service("default").items == []
    assert core.list_namespaced_persistent_volume_claim("default").items == []


def test_delete_collection_with_a_selector_and_dependents_among_the_items(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    owner = core.create_namespaced_config_map("default", {"metadata": {"name": "a", "labels": {"run": "x"}}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "b", "labels": {"run": "x"}, "ownerReferences": _owned_by(owner)}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "c", "labels": {"run": "y"}}})
    core.delete_collection_namespaced_config_map("default", label_selector="run=x")
    assert [c.metadata.name for c in core.list_namespaced_config_map("default").items] == ["c"]
