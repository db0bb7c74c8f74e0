"""The operator's child cache (operator/control/cache.py) against the API emulator over HTTP: what it holds
follows the server through its label-filtered watch, across a stream that ends and a history compacted away,
and a kind the server does not serve is read from the server instead."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from harnessrl.operator.control.apply import Kube, path
from harnessrl.operator.control.cache import ChildCache, Store

from tests.kube_emulator.server import KubeEmulator

NS = "default"
MANAGED = {"app.kubernetes.io/managed-by": "harnessrl-operator"}
SELECTOR = "app.kubernetes.io/managed-by=harnessrl-operator"
CONFIGMAP = ("v1", "ConfigMap")
JOBSET = ("jobset.x-k8s.io/v1alpha2", "JobSet")  # no CRD in this emulator: not served


def configmap(name: str, value: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS,
                                                                  "labels": MANAGED | {"run": "a"} if labels is None else labels},
            "data": {"v": value}}


class Changes:
    """What the cache reported, by name (thread-safe: reflectors call it from their threads)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self._mu = threading.Lock()

    def __call__(self, kind: str, obj: dict[str, Any]) -> None:
        with self._mu:
            self.seen.append((kind, obj["metadata"]["name"]))

    def names(self) -> set[str]:
        with self._mu:
            return {name for _, name in self.seen}


@pytest.fixture
def cache(kube_api: Any) -> Iterator[tuple[ChildCache, Changes]]:
    changes = Changes()
    cache = ChildCache(Kube(kube_api.client(), timeout=5),
                       {CONFIGMAP: {NS: path(*CONFIGMAP, NS)}, JOBSET: {NS: path(*JOBSET, NS)}}, SELECTOR, changes)
    cache.start()
    try:
        yield cache, changes
    finally:
        cache.stop()
        kube_api.end_watches()


def values(cache: ChildCache, selector: dict[str, str] | None = None) -> dict[str, str] | None:
    found = cache.select(*CONFIGMAP, NS, selector or {})
    return None if found is None else {o["metadata"]["name"]: o["data"]["v"] for o in found}


def test_the_cache_follows_creates_changes_and_deletes_of_labelled_objects_only(kube_api: Any, cache: Any) -> None:
    child_cache, changes = cache
    kube_api.apply(configmap("before", "0"))  # listed, not watched: present either way
    kube_api.wait_for(lambda: values(child_cache) == {"before": "0"})
    kube_api.apply(configmap("a", "1"))
    kube_api.apply(configmap("mine-not", "1", labels={"run": "a"}))  # not the operator's: never cached
    kube_api.wait_for(lambda: values(child_cache) == {"before": "0", "a": "1"})
    kube_api.patch("v1", "ConfigMap", "a", {"data": {"v": "2"}}, namespace=NS)
    kube_api.wait_for(lambda: values(child_cache) == {"before": "0", "a": "2"})
    kube_api.delete("v1", "ConfigMap", "before", namespace=NS)
    kube_api.wait_for(lambda: values(child_cache) == {"a": "2"})
    assert values(child_cache, {"run": "a"}) == {"a": "2"} and values(child_cache, {"run": "b"}) == {}
    assert "mine-not" not in changes.names() and {"a", "before"} <= changes.names()
    # Readers get copies: changing one changes nothing the next reader sees.
    found = child_cache.select(*CONFIGMAP, NS, {})
    found[0]["data"]["v"] = "changed by a reader"
    assert values(child_cache) == {"a": "2"}
    # A kind the server does not serve is not answered from the cache (None: ask the server).
    assert child_cache.select(*JOBSET, NS, {}) is None


def test_after_a_410_the_cache_lists_again_and_reports_what_it_missed(kube_api: Any, cache: Any) -> None:
    child_cache, changes = cache
    kube_api.apply(configmap("a", "1"))
    kube_api.wait_for(lambda: values(child_cache) == {"a": "1"})
    kube_api.wait_for(lambda: any(r.params.get("watch") and r.url.path.endswith("/configmaps")
                                  for r in list(kube_api.emulator._requests)))

    def restart_after_missed_changes(emulator: KubeEmulator) -> None:
        # Atomically: the cache's last resourceVersion is compacted away before it can resume.
        emulator.close_watches()
        configmaps = emulator.store.resource_type("", "v1", "configmaps")
        emulator.store.create(configmaps, NS, configmap("missed", "1"))
        emulator.store.delete(configmaps, NS, "a", {})
        emulator.store.compact()

    kube_api.call(restart_after_missed_changes)
    kube_api.wait_for(lambda: values(child_cache) == {"missed": "1"}, timeout=20)
    assert "missed" in changes.names()
    lists = [r for r in list(kube_api.emulator._requests)
             if r.url.path.endswith("/configmaps") and r.method == "GET" and not r.params.get("watch")]
    assert len(lists) == 2  # the first LIST, and the one after 410 Gone


def test_a_write_is_read_back_at_once_and_a_relist_replaces_only_its_own_scope() -> None:
    store = Store()
    newer = configmap("a", "new") | {"metadata": {"name": "a", "namespace": NS, "resourceVersion": "12"}}
    older = configmap("a", "old") | {"metadata": {"name": "a", "namespace": NS, "resourceVersion": "9"}}
    assert store.put(newer) is True
    assert store.put(older) is False and store.put(newer) is False
    assert [o["data"]["v"] for o in store.select(NS, {})] == ["new"]
    # A fresh LIST is the truth of its scope: what it lacks is gone, what it changed is reported. Another watched
    # namespace's objects (another reflector's LIST) stay.
    elsewhere = configmap("c", "c") | {"metadata": {"name": "c", "namespace": "team-b", "resourceVersion": "10"}}
    assert store.put(elsewhere) is True
    relisted = configmap("b", "b") | {"metadata": {"name": "b", "namespace": NS, "resourceVersion": "13"}}
    assert sorted(o["metadata"]["name"] for o in store.replace([relisted], NS)) == ["a", "b"]
    assert [o["metadata"]["name"] for o in store.select(NS, {})] == ["b"]
    assert [o["metadata"]["name"] for o in store.select("team-b", {})] == ["c"]
    assert [o["metadata"]["name"] for o in store.replace([relisted], None)] == ["c"]  # cluster-wide: c is gone
    assert store.select("team-b", {}) == []
