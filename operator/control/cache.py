"""Cached reads of the operator's children: label-filtered LIST + WATCH per kind (an informer), so a reconcile
reads what a run has from memory instead of a dozen LISTs against the API server on every resync.

A reflector per kind and scope (cluster-wide, or each watched namespace) lists the objects that carry the
operator's managed-by label, then watches from that list's resourceVersion (bookmarks keep it current; a 410
Gone or a broken stream lists again). `on_change` runs after the store holds a change, so a reconcile it
triggers reads the new state. The operator's own writes go into the store from the server's answer, so a read
after a write sees it. A stale entry costs at most a 409 or a redundant patch (apply.py's `ensure`), and the
next event corrects it. A kind whose LIST the server refuses (RBAC, not served) or that has not listed yet is
not answered from the cache: its reads go to the server.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlencode

from kubernetes.client.exceptions import ApiException

log = logging.getLogger("harnessrl.operator.cache")
Manifest = dict[str, Any]
KindKey = tuple[str, str]  # (apiVersion, kind)


class ApiServer(Protocol):
    """What the cache reads the API server with (apply.py's Kube, which in turn answers LISTs from the cache: the
    cache names only these calls, so the two modules do not import each other)."""

    timeout: float

    def request(self, method: str, url: str, body: Any = None, *, content_type: str | None = None) -> Manifest: ...

    def stream(self, url: str, read_timeout: float) -> Any: ...
OnChange = Callable[[str, Manifest], None]  # (kind, the object as it now is, or as it was when deleted)

WATCH_SECONDS = 300  # the server ends each watch after about this long (jittered); the reflector resumes it


def _newer(have: str, got: str) -> bool:
    """Whether resourceVersion `got` may replace `have`: they are opaque, so unless both are numbers (etcd's
    revisions, and the emulator's) the later arrival wins."""
    return not (have.isdigit() and got.isdigit()) or int(got) >= int(have)


def _selected(labels: dict[str, str], selector: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


class Store:
    """One kind's objects by (namespace, name), kept as JSON text so no reader can change what others read."""

    def __init__(self) -> None:
        self._objects: dict[tuple[str, str], tuple[dict[str, str], str, str]] = {}  # -> (labels, rv, json)
        self._mu = threading.Lock()

    @staticmethod
    def _key(obj: Manifest) -> tuple[str, str]:
        meta = obj["metadata"]
        return meta.get("namespace") or "", meta["name"]

    @staticmethod
    def _entry(obj: Manifest) -> tuple[dict[str, str], str, str]:
        meta = obj["metadata"]
        return dict(meta.get("labels") or {}), str(meta.get("resourceVersion") or ""), json.dumps(obj)

    def put(self, obj: Manifest) -> bool:
        """Store `obj` unless the store holds a newer version; whether it changed anything."""
        entry = self._entry(obj)
        with self._mu:
            have = self._objects.get(self._key(obj))
            if have is not None and (have[1] == entry[1] or not _newer(have[1], entry[1])):
                return False
            self._objects[self._key(obj)] = entry
            return True

    def drop(self, namespace: str, name: str) -> bool:
        with self._mu:
            return self._objects.pop((namespace, name), None) is not None

    def replace(self, objects: list[Manifest], namespace: str | None) -> list[Manifest]:
        """Hold exactly `objects` in `namespace` (None: every namespace), a fresh LIST of that scope; returns those
        that are new or changed, and those gone. Other namespaces' objects (another reflector's scope) stay."""
        fresh = {self._key(o): self._entry(o) for o in objects}
        with self._mu:
            scoped = {key: entry for key, entry in self._objects.items() if namespace is None or key[0] == namespace}
            gone = [json.loads(entry[2]) for key, entry in scoped.items() if key not in fresh]
            changed = [json.loads(entry[2]) for key, entry in fresh.items()
                       if (have := scoped.get(key)) is None or have[1] != entry[1]]
            for key in scoped:
                del self._objects[key]
            self._objects.update(fresh)
        return changed + gone

    def select(self, namespace: str, selector: dict[str, str]) -> list[Manifest]:
        with self._mu:
            found = [entry[2] for (ns, _), entry in self._objects.items()
                     if ns == namespace and _selected(entry[0], selector)]
        return [json.loads(text) for text in found]


class Reflector:
    """Keeps one Store current for one kind in one scope, in its own daemon thread."""

    def __init__(self, kube: ApiServer, kind: str, namespace: str | None, list_path: str, label_selector: str,
                 store: Store, on_change: OnChange, stop: threading.Event) -> None:
        self.kube, self.kind, self.namespace, self.list_path = kube, kind, namespace, list_path
        self.label_selector, self.store, self.on_change, self._stop = label_selector, store, on_change, stop
        self.synced = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"harnessrl-watch-{kind}", daemon=True)

    def _url(self, query: dict[str, str]) -> str:
        return f"{self.list_path}?{urlencode(query)}"

    def _list(self) -> str:
        """LIST into the store; the list's resourceVersion to watch from."""
        body = self.kube.request("GET", self._url({"labelSelector": self.label_selector}))
        for obj in self.store.replace(body.get("items") or [], self.namespace):
            self.on_change(self.kind, obj)
        self.synced.set()
        return str(body.get("metadata", {}).get("resourceVersion") or "")

    def _watch(self, rv: str) -> str:
        """Apply one watch's events until the server ends it; the last resourceVersion seen ('' after a 410)."""
        seconds = int(WATCH_SECONDS * random.uniform(0.8, 1.2))
        query = {"watch": "1", "labelSelector": self.label_selector, "resourceVersion": rv,
                 "allowWatchBookmarks": "true", "timeoutSeconds": str(seconds)}
        response = self.kube.stream(self._url(query), seconds + self.kube.timeout)
        try:
            for line in response.response:  # one JSON event per line
                if self._stop.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:  # the history is gone: list again
                        return ""
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                rv = str(obj.get("metadata", {}).get("resourceVersion") or rv)
                if event.get("type") == "DELETED":
                    if self.store.drop(obj["metadata"].get("namespace") or "", obj["metadata"]["name"]):
                        self.on_change(self.kind, obj)
                elif event.get("type") in ("ADDED", "MODIFIED") and self.store.put(obj):
                    self.on_change(self.kind, obj)
        finally:
            response.response.release_conn()
        return rv

    def _loop(self) -> None:
        rv, delay = "", 1.0
        while not self._stop.is_set():
            try:
                rv = rv or self._list()
                rv = self._watch(rv)
                delay = 1.0
                continue
            except ApiException as exc:
                if exc.status == 410:
                    rv = ""
                    continue
                self.synced.clear()  # refused (RBAC, not served): reads go to the server until a LIST works
                log.warning("cannot watch %s (%s %s); reading them from the API server, retrying in %.0f s",
                            self.kind, exc.status, exc.reason, delay)
                rv = ""
            except Exception as exc:  # a broken stream or connection: list again after a pause
                log.info("watch of %s ended (%s); listing again in %.0f s", self.kind, exc, delay)
                rv = ""
            self._stop.wait(delay)
            delay = min(delay * 2, 60.0)


class ChildCache:
    """The stores of the kinds the operator caches, their reflectors, and the reads and writes through them."""

    def __init__(self, kube: ApiServer, kinds: dict[KindKey, dict[str | None, str]], label_selector: str,
                 on_change: OnChange) -> None:
        """`kinds`: each (apiVersion, kind) with its LIST path per scope: None (cluster-wide), or each watched
        namespace."""
        self._stop = threading.Event()
        self._stores = {key: Store() for key in kinds}
        self._reflectors = {key: [Reflector(kube, key[1], ns, p, label_selector, self._stores[key], on_change, self._stop)
                                  for ns, p in scopes.items()]
                            for key, scopes in kinds.items()}

    def start(self) -> None:
        self._stop.clear()
        for reflectors in self._reflectors.values():
            for reflector in reflectors:
                reflector.thread.start()

    def stop(self) -> None:
        """The reflectors finish at their stream's next event or end (they are daemon threads: nothing waits)."""
        self._stop.set()

    def wait_synced(self, timeout: float) -> bool:
        """Wait until every kind has listed once (or `timeout`); whether they all have."""
        return all(r.synced.wait(timeout) for rs in self._reflectors.values() for r in rs)

    def select(self, api_version: str, kind: str, namespace: str, selector: dict[str, str]) -> list[Manifest] | None:
        """The cached objects of a kind in `namespace` that carry `selector`'s labels; None when the kind is not
        cached or has not listed (the caller asks the server)."""
        reflectors = self._reflectors.get((api_version, kind))
        if not reflectors or not all(r.synced.is_set() for r in reflectors):
            return None
        return self._stores[(api_version, kind)].select(namespace, selector)

    def wrote(self, obj: Manifest) -> None:
        """The server's answer to a create, patch or update of one of the cached kinds."""
        store = self._stores.get((obj.get("apiVersion", ""), obj.get("kind", "")))
        if store is not None and obj.get("metadata", {}).get("name"):
            store.put(obj)

    def deleted(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        store = self._stores.get((api_version, kind))
        if store is not None:
            store.drop(namespace, name)
