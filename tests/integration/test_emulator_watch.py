"""Watch streams and selectors of the Kubernetes API emulator, through the official client's `Watch`."""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.fixtures.kube import KubeApi


def _events(core: client.CoreV1Api, **kwargs: Any) -> list[tuple[str, str, dict[str, str]]]:
    """(type, name, data) of every event until the server ends the stream (timeoutSeconds=1)."""
    stream = watch.Watch().stream(core.list_namespaced_config_map, "default", timeout_seconds=1, **kwargs)
    return [(e["type"], e["object"].metadata.name, e["object"].data or {}) for e in stream]


def _cm(name: str, labels: dict[str, str] | None = None, data: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "data": data or {}}


def test_watch_resumes_from_a_resource_version(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    before = core.create_namespaced_config_map("default", _cm("a"))
    core.patch_namespaced_config_map("a", "default", {"data": {"k": "1"}})
    core.create_namespaced_config_map("default", _cm("b"))
    core.delete_namespaced_config_map("a", "default")
    events = _events(core, resource_version=before.metadata.resource_version)
    assert events == [("MODIFIED", "a", {"k": "1"}), ("ADDED", "b", {}), ("DELETED", "a", {"k": "1"})]
    # Without a resourceVersion, a watch starts with the current state.
    assert _events(core) == [("ADDED", "b", {})]


def test_watch_streams_live_changes(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    listed = core.list_namespaced_config_map("default")
    w = watch.Watch()
    seen: list[tuple[str, str]] = []
    core.create_namespaced_config_map("default", _cm("live"))
    for event in w.stream(core.list_namespaced_config_map, "default", resource_version=listed.metadata.resource_version,
                          timeout_seconds=5):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 1:
            core.patch_namespaced_config_map("live", "default", {"data": {"x": "y"}})
        else:
            w.stop()
    assert seen == [("ADDED", "live"), ("MODIFIED", "live")]


def test_watch_from_a_compacted_version_is_410_gone(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    old = core.create_namespaced_config_map("default", _cm("a"))
    core.patch_namespaced_config_map("a", "default", {"data": {"k": "1"}})
    kube_api.compact_history()
    with pytest.raises(ApiException) as gone:
        _events(core, resource_version=old.metadata.resource_version)
    assert gone.value.status == 410
    # Resuming from the current version still works after compaction.
    now = core.list_namespaced_config_map("default").metadata.resource_version
    core.create_namespaced_config_map("default", _cm("b"))
    assert _events(core, resource_version=now) == [("ADDED", "b", {})]


_SELECTORS = {
    "tier=web": ["a", "b"],
    "tier==web,env!=prod": ["a"],
    "tier!=web": ["c", "d"],
    "env in (prod,staging)": ["b", "c"],
    "env notin (prod)": ["a", "c", "d"],
    "env": ["a", "b", "c"],
    "!env": ["d"],
}


def test_label_selectors_on_list_and_watch(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    start = core.list_namespaced_config_map("default").metadata.resource_version
    for name, labels in [("a", {"tier": "web", "env": "dev"}), ("b", {"tier": "web", "env": "prod"}),
                         ("c", {"tier": "db", "env": "staging"}), ("d", {"tier": "db"})]:
        core.create_namespaced_config_map("default", _cm(name, labels))
    for selector, expected in _SELECTORS.items():
        listed = core.list_namespaced_config_map("default", label_selector=selector)
        assert [c.metadata.name for c in listed.items] == expected, selector
    # One watch per selector, side by side (each lasts until its 1 s server timeout).
    with concurrent.futures.ThreadPoolExecutor(len(_SELECTORS)) as pool:
        watched = dict(zip(_SELECTORS, pool.map(
            lambda s: [name for _, name, _ in _events(core, resource_version=start, label_selector=s)], _SELECTORS), strict=True))
    assert watched == _SELECTORS


def test_field_selectors_on_list_and_watch(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    core.create_namespace({"metadata": {"name": "other"}})
    core.create_namespaced_config_map("default", _cm("a"))
    core.create_namespaced_config_map("other", _cm("a"))
    core.create_namespaced_config_map("other", _cm("b"))
    everywhere = core.list_config_map_for_all_namespaces(field_selector="metadata.name=a")
    assert sorted(c.metadata.namespace for c in everywhere.items) == ["default", "other"]
    in_other = core.list_config_map_for_all_namespaces(field_selector="metadata.namespace=other,metadata.name!=a")
    assert [c.metadata.name for c in in_other.items] == ["b"]
    events = list(watch.Watch().stream(core.list_config_map_for_all_namespaces, field_selector="metadata.namespace=other",
                                       timeout_seconds=1))
    assert sorted(e["object"].metadata.name for e in events) == ["a", "b"]
    with pytest.raises(ApiException) as unsupported:
        core.list_namespaced_config_map("default", field_selector="data.k=v")
    assert unsupported.value.status == 400


def test_objects_entering_and_leaving_a_selector_are_added_and_deleted(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client())
    start = core.create_namespaced_config_map("default", _cm("x", {"stage": "new"})).metadata.resource_version
    core.patch_namespaced_config_map("x", "default", {"metadata": {"labels": {"stage": "ready"}}})
    core.patch_namespaced_config_map("x", "default", {"data": {"k": "v"}})
    core.patch_namespaced_config_map("x", "default", {"metadata": {"labels": {"stage": "done"}}})
    events = _events(core, resource_version=start, label_selector="stage=ready")
    assert [(t, d) for t, _, d in events] == [("ADDED", {}), ("MODIFIED", {"k": "v"}), ("DELETED", {"k": "v"})]


def test_an_idle_watch_gets_bookmarks_that_outlive_a_compaction(kube_api: KubeApi) -> None:
    """With allowWatchBookmarks, a watch whose own objects do not change is told the store's newer
    resourceVersion now and then (BOOKMARK); resuming from it works after the history before it is compacted,
    where resuming from the watch's last object would be 410 Gone."""
    import httpx

    kube_api.call(lambda emulator: setattr(emulator, "bookmark_seconds", 0.2))
    core = client.CoreV1Api(kube_api.client())
    start = core.create_namespaced_config_map("default", _cm("watched", {"app": "x"})).metadata.resource_version
    headers = {"Authorization": "Bearer emulator"}
    params = {"watch": "1", "labelSelector": "app=x", "resourceVersion": start, "allowWatchBookmarks": "true",
              "timeoutSeconds": "3"}
    with httpx.stream("GET", f"{kube_api.url}/api/v1/namespaces/default/configmaps", params=params, headers=headers,
                      timeout=10) as stream:
        for name in ("other-1", "other-2"):  # changes the watch does not see (not labelled app=x)
            core.create_namespaced_config_map("default", _cm(name))
        latest = core.read_namespaced_config_map("other-2", "default").metadata.resource_version
        events = [json.loads(line) for line in stream.iter_lines() if line.strip()]
    assert [e["type"] for e in events] == ["BOOKMARK"]  # one: later ticks find nothing newer to tell
    assert events[0]["object"]["metadata"]["resourceVersion"] == latest
    kube_api.compact_history()
    resumed = _events(core, label_selector="app=x", resource_version=latest)
    assert resumed == []  # no 410: the bookmark's version is still served
    with pytest.raises(ApiException) as gone:
        _events(core, label_selector="app=x", resource_version=start)
    assert gone.value.status == 410
