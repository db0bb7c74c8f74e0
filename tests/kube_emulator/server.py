"""The kmock handler that speaks the Kubernetes API over HTTP on top of the Store."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import rendering

from . import admission_policy, authz, errors
from .authz import User
from .podexec import PodExec
from .resources import ResourceType
from .routing import Route, parse_path
from .selectors import field_matcher, label_matcher
from .store import Store, WatchEvent

# How often an idle watch wakes up to notice a gone client or its timeoutSeconds.
_WATCH_TICK = 0.5
_OWN_PRIORITY = -1000
_MAX_REQUEST_BYTES = 3 * 1024 * 1024  # the API server's limit on a request body (twice etcd's 1.5 MiB)
_VERSION_INFO = {
    "major": "1", "minor": "33", "gitVersion": "v1.33.0-harnessrl-emulator", "gitCommit": "", "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64",
}


def _response(payload: Any, status: int = 200, warnings: list[str] | None = None) -> rendering.Response:
    # One Warning header holding the list (RFC 9110 allows a comma-joined field), code 299 as the server sends.
    # kmock merges a reaction's headers into its own across requests: None (never sent) clears an earlier one.
    headers: dict[str, str | None] = {"Content-Type": "application/json",
                                      "Warning": ", ".join("299 - " + json.dumps(w) for w in warnings) if warnings else None}
    return rendering.Response(status=status, payload=payload, headers=headers)


def _refuse_constant(name: str) -> Any:
    # Go's encoding/json has no NaN or Infinity: the server cannot parse such a body.
    raise ValueError(f"invalid character '{name.lstrip('-')[0]}' looking for beginning of value")


def parse_json(body: bytes) -> Any:
    """JSON as the API server's decoder reads it (no NaN, Infinity or -Infinity)."""
    return json.loads(body, parse_constant=_refuse_constant)


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesScaffold):
    """kmock's Kubernetes scaffold (HTTP server, request log, DSL, Status rendering) with a stateful API.

    Every Kubernetes path is answered by one low-priority kmock reaction (`_serve`), so reactions that tests
    add with kmock's DSL (e.g. `emulator['get /api/v1/namespaces/default/pods'] << 500`) take precedence.
    """

    store: Store = attrs.field(factory=Store)
    _server_address: str = attrs.field(default="127.0.0.1:0")
    pod_exec: PodExec = attrs.field(factory=PodExec)
    # Bearer token -> user. None: no authentication, every request may do anything (most tests); set: an
    # unknown or missing token is 401 and each resource request is authorized by the stored RBAC objects.
    users: dict[str, User] | None = None
    refusals: list[str] = attrs.field(factory=list, init=False)  # every 401/403 answered, for assertions
    # A watch that allows bookmarks gets one this often when idle and behind the store (the server: about 1/min).
    bookmark_seconds: float = 60.0
    _own: Any = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # Above kmock's own scaffold fallbacks (priority -inf), below anything a test declares (0).
        self._own = (self ** _OWN_PRIORITY)[re.compile(r"/.*")] << self._serve

    # -- entry point ---------------------------------------------------------------------------------------
    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kmock's RawHandler.__call__, but with a Kubernetes path parser that understands every path."""
        if (raw_request.content_length or 0) > _MAX_REQUEST_BYTES:
            return await self._render_error(errors.request_entity_too_large(_MAX_REQUEST_BYTES))
        raw_request._client_max_size = _MAX_REQUEST_BYTES  # aiohttp's own default is 1 MiB
        await raw_request.read()
        if raw_request.headers.get("Upgrade", "").lower() == "websocket":
            try:
                return await self._exec(raw_request)
            except kmock.KubernetesError as e:
                return await self._render_error(e)
        raw_response: aiohttp.web.StreamResponse | None = None
        try:
            request = await self._parse(raw_request)
            self._requests.append(request)
            try:
                return await self._handle(request)
            except rendering.StreamingError as e:
                raw_response = e.args[0]
                raise e.__cause__ or e from None
        except Exception as e:
            if not isinstance(e, kmock.KubernetesError) and self._errors:
                self._errors[-1].append(e)  # an emulator fault, kept for assertions (kmock's convention)
            if isinstance(e, kmock.KubernetesError) and e.status in (401, 403):
                self.refusals.append(f"{e.status} {raw_request.method} {raw_request.path}: {e.message}")
            if raw_response is None or not raw_response.prepared:
                return await self._render_error(e)
            await self._stream_error(e, raw_response)
            await raw_response.write_eof()
            return raw_response

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        # kmock matches a request by replaying the whole request log through each payload's filters, O(log) per
        # request: 100 runs spent 67 of the emulator's 80 CPU s there. With no reaction declared above the
        # emulator's own catch-all (which matches every path and never depletes), kmock would pick it first.
        if all(p is self._own or (p.priorities and p.priorities[0] < _OWN_PRIORITY) for p in self._payloads):
            return await self._own(request)
        return await super()._handle(request)

    async def _exec(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """pods/exec, the one WebSocket endpoint served (podexec.py); the Pod must exist and be Running."""
        route = parse_path(raw_request.path)
        if (route.kind, route.plural, route.subresource) != ("resource", "pods", "exec") or route.name is None:
            raise errors.bad_request(f"no WebSocket endpoint at {raw_request.path}")
        user = self._authenticate(raw_request.headers)
        self._authorize(user, authz.request_attributes("POST", route, False))
        # Then admission, as for any CONNECT: the object is the request's PodExecOptions.
        query = raw_request.query
        options = {"kind": "PodExecOptions", "apiVersion": "v1", "command": query.getall("command", []),
                   "container": query.get("container", ""),
                   **{k: query.get(k) in ("true", "1") for k in ("stdin", "stdout", "stderr", "tty")}}
        self.store.admit_policies(admission_policy.Request("CONNECT", "", "v1", "pods", "exec", "PodExecOptions",
                                                           route.namespace, route.name, user), options, None)
        pod = self.store.get(self.store.resource_type("", "v1", "pods"), route.namespace, route.name)
        phase = pod.get("status", {}).get("phase")
        if phase != "Running":
            raise errors.bad_request(f"pod {route.name} is not running (phase {phase}): cannot exec into it")
        return await self.pod_exec.serve(raw_request, pod)

    async def _parse(self, raw_request: aiohttp.web.BaseRequest) -> rendering.Request:
        body = await raw_request.read()
        try:
            data = parse_json(body) if body else None
        except ValueError:
            data = None
        route = parse_path(raw_request.path)
        is_k8s = route.kind == "resource"
        method = kmock.method(raw_request.method)
        action = None
        if is_k8s:
            if method == kmock.method.GET and raw_request.query.get("watch") in ("true", "1"):
                action = kmock.action.WATCH
            elif route.name is None:
                action = {"GET": kmock.action.LIST, "POST": kmock.action.CREATE}.get(raw_request.method)
            else:
                action = {"GET": kmock.action.FETCH, "PATCH": kmock.action.UPDATE, "PUT": kmock.action.UPDATE,
                          "DELETE": kmock.action.DELETE}.get(raw_request.method)
        namespace = route.namespace if route.plural != "namespaces" else None
        return rendering.Request(
            id=len(self._requests), raw_request=raw_request, url=raw_request.url, method=raw_request.method,
            params=dict(raw_request.query), headers=dict(raw_request.headers), cookies=dict(raw_request.cookies),
            body=body, text=body.decode("utf-8", "replace"), data=data, action=action,
            resource=kmock.resource(route.group, route.version, route.plural) if is_k8s else None,
            namespace=namespace, name=route.name, subresource=route.subresource,
        )

    async def _serve(self, request: rendering.Request) -> rendering.Response:
        route = parse_path(request.url.path)
        user = self._authenticate(request.headers)
        if route.kind == "resource":
            return await self._serve_resource(request, route, user)
        if route.kind == "root":
            return _response({"paths": sorted(["/api", "/api/v1", "/apis", "/version", "/healthz"]
                                              + [f"/apis/{g}" for g in self.store.groups() if g])})
        if route.kind == "version":
            return _response(_VERSION_INFO)
        if route.kind == "health":
            return rendering.Response(status=200, payload=b"ok")
        if route.kind == "api":
            return _response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": self._server_address}]})
        if route.kind == "apis":
            return _response({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                self._group(g, vs) for g, vs in sorted(self.store.groups().items()) if g]})
        if route.kind == "group":
            versions = self.store.groups().get(route.group)
            if not versions or not route.group:
                raise errors.endpoint_not_found(request.url.path)
            return _response({"kind": "APIGroup", "apiVersion": "v1", **self._group(route.group, versions)})
        if route.kind == "groupversion":
            resources = [e for rt in self.store.types.values() if (rt.group, rt.version) == (route.group, route.version)
                         for e in rt.discovery_entries()]
            if not resources:
                raise errors.endpoint_not_found(request.url.path)
            return _response({"kind": "APIResourceList", "apiVersion": "v1",
                              "groupVersion": f"{route.group}/{route.version}" if route.group else route.version,
                              "resources": resources})
        raise errors.endpoint_not_found(request.url.path)

    @staticmethod
    def _group(group: str, versions: list[str]) -> dict[str, Any]:
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": entries, "preferredVersion": entries[0]}

    # -- resources ---------------------------------------------------------------------------------------
    def _authenticate(self, headers: Mapping[str, str]) -> User | None:
        if self.users is None:
            return None
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        user = self.users.get(token) if scheme.lower() == "bearer" else None
        if user is None:
            raise errors.unauthorized()
        return user

    def _authorize(self, user: User | None, wanted: authz.Attributes) -> None:
        # Only resource requests come here: discovery and health paths are open to every authenticated user
        # (system:discovery's default binding).
        if user is not None and not self.store.allows(user, wanted):
            raise errors.forbidden_resource(wanted.group, wanted.resource, wanted.name, authz.forbidden_message(user, wanted))

    async def _serve_resource(self, request: rendering.Request, route: Route, user: User | None) -> rendering.Response:
        store = self.store
        rt = store.resource_type(route.group, route.version, route.plural)
        namespace = route.namespace
        if route.plural == "namespaces":
            namespace = None
        elif namespace is not None and not rt.namespaced:
            raise errors.endpoint_not_found(request.url.path)
        if request.params.get("dryRun"):
            raise errors.bad_request("dryRun is not supported by the harnessrl Kubernetes API emulator")
        method = str(request.method.value).upper()
        if method in ("POST", "PUT") and request.body and request.data is None:
            try:
                parse_json(request.body)
            except ValueError as e:
                raise errors.bad_request(f"couldn't get version/kind; json parse error: {e}") from None
        watch = request.params.get("watch") in ("true", "1")
        self._authorize(user, authz.request_attributes(method, route, watch))
        store.begin_request(request.params.get("fieldValidation"), user)
        if route.name is None:
            if method == "GET" and watch:
                return rendering.Response(status=200, payload=self._watch(request, rt, namespace, None),
                                          headers={"Content-Type": "application/json"})
            if method == "GET":
                return _response(self._list(request, rt, namespace))
            if method == "POST":
                return _response(store.create(rt, namespace, request.data), 201, store.warnings)
            if method == "DELETE":
                return _response(self._delete_collection(request, rt, namespace))
        else:
            if method == "GET" and watch:
                return rendering.Response(status=200, payload=self._watch(request, rt, namespace, route.name),
                                          headers={"Content-Type": "application/json"})
            if method == "GET":
                obj = store.get(rt, namespace, route.name)
                if route.subresource == "scale":
                    return _response(store.scale_of(rt, obj))
                if route.subresource not in (None, "status"):
                    raise errors.endpoint_not_found(request.url.path)
                return _response(obj)
            if method == "PUT":
                return _response(store.update(rt, namespace, route.name, request.data, route.subresource), warnings=store.warnings)
            if method == "PATCH":
                content_type = request.headers.get("Content-Type", "")
                return _response(store.patch(rt, namespace, route.name, content_type, request.body, route.subresource),
                                 warnings=store.warnings)
            if method == "DELETE" and route.subresource is None:
                options = dict(request.data) if isinstance(request.data, dict) else {}
                for param in ("propagationPolicy", "orphanDependents"):
                    if param in request.params:
                        options[param] = request.params[param] if param != "orphanDependents" else request.params[param] == "true"
                return _response(store.delete(rt, namespace, route.name, options))
        raise errors.status_error(405, "MethodNotAllowed", f"the server does not allow this method on the requested resource ({method} {request.url.path})")

    def _matcher(self, request: rendering.Request, name: str | None) -> Callable[[dict[str, Any]], bool]:
        labels = label_matcher(request.params.get("labelSelector"))
        fields = field_matcher(request.params.get("fieldSelector"))
        return lambda obj: labels(obj) and fields(obj) and (name is None or obj["metadata"]["name"] == name)

    def _list(self, request: rendering.Request, rt: ResourceType, namespace: str | None) -> dict[str, Any]:
        limit = int(request.params["limit"]) if request.params.get("limit") else None
        items, token, remaining = self.store.list_objects(rt, namespace, self._matcher(request, None), limit,
                                                  request.params.get("continue"))
        metadata: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
        if token:
            metadata.update({"continue": token, "remainingItemCount": remaining})
        return {"apiVersion": rt.api_version, "kind": f"{rt.kind}List", "metadata": metadata, "items": items}

    def _delete_collection(self, request: rendering.Request, rt: ResourceType, namespace: str | None) -> dict[str, Any]:
        items, _, _ = self.store.list_objects(rt, namespace, self._matcher(request, None))
        options = dict(request.data) if isinstance(request.data, dict) else {}
        deleted = []
        for obj in items:
            try:
                deleted.append(self.store.delete(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"], options))
            except kmock.KubernetesError as e:
                if e.status != 404:  # already collected as a dependent of an earlier item
                    raise
        return {"apiVersion": rt.api_version, "kind": f"{rt.kind}List",
                "metadata": {"resourceVersion": str(self.store.rv)}, "items": deleted}

    # -- watch -------------------------------------------------------------------------------------------
    def _translate(self, rt: ResourceType, namespace: str | None, matches: Callable[[dict[str, Any]], bool],
                   event: WatchEvent) -> dict[str, Any] | None:
        """A stored change as this watcher sees it: selectors turn entering/leaving into ADDED/DELETED."""
        if event.key != rt.storage_key:
            return None
        if namespace is not None and rt.namespaced and event.obj["metadata"].get("namespace") != namespace:
            return None
        new_ok = matches(event.obj)
        old_ok = event.old is not None and matches(event.old)
        kind = event.type
        if event.type == "MODIFIED":
            kind = "MODIFIED" if new_ok and old_ok else "ADDED" if new_ok else "DELETED" if old_ok else ""
        elif event.type == "DELETED":
            kind = "DELETED" if new_ok or old_ok else ""
        elif not new_ok:
            kind = ""
        return {"type": kind, "object": self.store.render(rt, event.obj)} if kind else None

    async def _watch(self, request: rendering.Request, rt: ResourceType, namespace: str | None,
                     name: str | None) -> AsyncIterator[bytes | dict[str, Any]]:
        store = self.store
        matches = self._matcher(request, name)
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        since = request.params.get("resourceVersion") or ""
        send_initial = request.params.get("sendInitialEvents") == "true" or since in ("", "0")
        deadline = time.monotonic() + float(request.params["timeoutSeconds"]) if request.params.get("timeoutSeconds") else None
        store.listeners.add(queue.put_nowait)
        try:
            # Everything up to here is synchronous, so the snapshot, the backlog and the queue line up exactly.
            if since not in ("", "0") and not since.isdigit():
                raise errors.bad_request(f"invalid resource version: {since!r}")
            try:
                backlog = store.events_since(int(since)) if since not in ("", "0") else []
            except kmock.KubernetesError as gone:
                yield b""
                yield {"type": "ERROR", "object": errors.status_body(gone)}
                return
            initial, _, _ = store.list_objects(rt, namespace, matches) if send_initial else ([], None, 0)
            bookmark_rv = store.rv
            yield b""  # sends the headers: the watch is established even if nothing happens
            for obj in initial:
                yield {"type": "ADDED", "object": obj}
            if request.params.get("sendInitialEvents") == "true" and request.params.get("allowWatchBookmarks") == "true":
                yield {"type": "BOOKMARK", "object": {
                    "kind": rt.kind, "apiVersion": rt.api_version,
                    "metadata": {"resourceVersion": str(bookmark_rv), "annotations": {"k8s.io/initial-events-end": "true"}}}}
            for event in backlog:
                out = self._translate(rt, namespace, matches, event)
                if out is not None:
                    yield out
            bookmarks = request.params.get("allowWatchBookmarks") == "true"
            told_rv, next_bookmark = store.rv, time.monotonic() + self.bookmark_seconds
            while True:
                if deadline is not None and time.monotonic() >= deadline:
                    return
                transport = request._raw_request.transport if request._raw_request is not None else None
                if transport is None or transport.is_closing():
                    return
                tick = _WATCH_TICK if deadline is None else max(0.0, min(_WATCH_TICK, deadline - time.monotonic()))
                try:
                    event = await asyncio.wait_for(queue.get(), timeout=tick)
                except TimeoutError:
                    # The queue is empty: every change up to store.rv is sent, so a bookmark there skips none.
                    if bookmarks and time.monotonic() >= next_bookmark and store.rv > told_rv:
                        told_rv, next_bookmark = store.rv, time.monotonic() + self.bookmark_seconds
                        yield {"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version,
                                                              "metadata": {"resourceVersion": str(told_rv)}}}
                    continue
                if event.type == "CLOSE" or (event.type == "GONE" and event.key == rt.storage_key):
                    return
                out = self._translate(rt, namespace, matches, event)
                if out is not None:
                    yield out
        finally:
            store.listeners.discard(queue.put_nowait)

    def close_watches(self) -> None:
        """End every open watch (before the server stops, so it need not wait for them)."""
        for listener in list(self.store.listeners):
            listener(WatchEvent(self.store.rv, ("", ""), "CLOSE", {}, None))
