"""The emulator's state: objects, the global resourceVersion counter, the watch history, and the
server-side behaviours that a real cluster implements in the API server and its built-in controllers
(garbage collection, finalizers, namespace termination, CRD establishment).

Synchronous and single-threaded: it is only called from the emulator's event loop, so no locks.
"""

from __future__ import annotations

import base64
import collections
import datetime
import json
import random
import string
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from . import admission_policy, authz, errors, pod_security
from .builtin_rules import object_meta_causes, semantic_causes
from .builtin_schema import DecodeError, decode
from .builtins import (
    allocate_cluster_ip,
    immutability_causes,
    initial_status,
    keep_cluster_ip,
    normalize_secret,
)
from .cel_rules import compile_rule
from .go_text import invalid as go_invalid
from .go_text import is_dns1123_label, is_dns1123_subdomain
from .patching import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from .resources import (
    BUILTIN_RESOURCES,
    INITIAL_NAMESPACES,
    ResourceType,
    crd_problems,
    resource_types_of_crd,
    version_priority,
)
from .schema import all_rules, prune_and_default, validate
from .selectors import selector_string
from .values import MISSING, clone

StorageKey = tuple[str, str]  # (group, plural)
ObjectKey = tuple[str, str]  # (namespace or "", name)

_ETCD_MAX_REQUEST_BYTES = 1536 * 1024  # etcd's default --max-request-bytes; objects measured as compact JSON
CRD_KEY: StorageKey = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACE_KEY: StorageKey = ("", "namespaces")
SERVICE_KEY: StorageKey = ("", "services")
SECRET_KEY: StorageKey = ("", "secrets")
POD_KEY: StorageKey = ("", "pods")
ROLE_KEY: StorageKey = (authz.RBAC_GROUP, "roles")
CLUSTER_ROLE_KEY: StorageKey = (authz.RBAC_GROUP, "clusterroles")
ROLE_BINDING_KEY: StorageKey = (authz.RBAC_GROUP, "rolebindings")
CLUSTER_ROLE_BINDING_KEY: StorageKey = (authz.RBAC_GROUP, "clusterrolebindings")
POLICY_KEY: StorageKey = ("admissionregistration.k8s.io", "validatingadmissionpolicies")
POLICY_BINDING_KEY: StorageKey = ("admissionregistration.k8s.io", "validatingadmissionpolicybindings")
# Metadata the server owns: clients cannot change it with an update or a patch.
_SERVER_METADATA = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation",
                    "name", "namespace")


@dataclass(frozen=True)
class WatchEvent:
    """One change, as watchers see it. `old` is the previous state (selectors need both)."""

    rv: int
    key: StorageKey
    type: str  # ADDED, MODIFIED, DELETED; or GONE when the resource stopped being served
    obj: dict[str, Any]
    old: dict[str, Any] | None


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = obj.setdefault("metadata", {})
    return meta


def _content(obj: dict[str, Any], with_status: bool) -> dict[str, Any]:
    """The part of an object whose change bumps metadata.generation."""
    skipped = ("metadata", "apiVersion", "kind") + (() if with_status else ("status",))
    return {k: v for k, v in obj.items() if k not in skipped}


def _without_rv(obj: dict[str, Any]) -> dict[str, Any]:
    stripped = dict(obj)
    stripped["metadata"] = {k: v for k, v in obj.get("metadata", {}).items() if k != "resourceVersion"}
    return stripped


def _path_parts(path: str) -> list[str]:
    return [p for p in path.split(".") if p]


def get_path(obj: Any, path: str) -> Any:
    for part in _path_parts(path):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = _path_parts(path)
    for part in parts[:-1]:
        obj = obj.setdefault(part, {})
    obj[parts[-1]] = value


def _no_constant(name: str) -> Any:
    raise ValueError(f"invalid character '{name.lstrip('-')[0]}' looking for beginning of value")


def _has_non_finite(value: Any) -> bool:
    """YAML's .nan/.inf: JSON (and so the server) has no such numbers."""
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    return isinstance(value, list) and any(_has_non_finite(v) for v in value)


class Store:
    """All objects of all resources, with the behaviours of the API server around them."""

    def __init__(self, history_limit: int = 10_000) -> None:
        self.rv = 0
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self.objects: dict[StorageKey, dict[ObjectKey, dict[str, Any]]] = collections.defaultdict(dict)
        self.live_uids: set[str] = set()  # of every stored object: owner checks without a scan of all objects
        self.history: collections.deque[WatchEvent] = collections.deque(maxlen=history_limit)
        self.floor = 0  # the events after this resourceVersion are all still in `history`
        self.listeners: set[Callable[[WatchEvent], None]] = set()
        self.field_validation = "Warn"
        self.warnings: list[str] = []  # of the request being served, for its Warning headers
        self.user: authz.User | None = None  # who sends it, when the server authenticates (None: no RBAC)
        for rt in BUILTIN_RESOURCES:
            self.types[(rt.group, rt.version, rt.plural)] = rt
        for name in INITIAL_NAMESPACES:
            self.create(self.resource_type("", "v1", "namespaces"), None, {"metadata": {"name": name}})

    # -- resource types ---------------------------------------------------------------------------------
    def resource_type(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.types.get((group, version, plural))
        if rt is None:
            base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
            raise errors.endpoint_not_found(f"{base}/{plural}")
        return rt

    def groups(self) -> dict[str, list[str]]:
        """Served group -> versions, highest priority first."""
        versions: dict[str, set[str]] = collections.defaultdict(set)
        for group, version, _ in self.types:
            versions[group].add(version)
        return {g: sorted(vs, key=version_priority) for g, vs in versions.items()}

    def _type_of(self, key: StorageKey) -> ResourceType:
        candidates = [rt for rt in self.types.values() if rt.storage_key == key]
        return min(candidates, key=lambda rt: version_priority(rt.version))

    # -- the change log ---------------------------------------------------------------------------------
    def _commit(self, key: StorageKey, event_type: str, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        if event_type != "DELETED" and len(json.dumps(obj, separators=(",", ":"))) > _ETCD_MAX_REQUEST_BYTES:
            # etcd refuses the write and the server passes its error on as a 500 (kubernetes#112152, still open).
            raise errors.status_error(500, "InternalError", "etcdserver: request is too large")
        self.rv += 1
        _meta(obj)["resourceVersion"] = str(self.rv)
        object_key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if event_type == "DELETED":
            self.objects[key].pop(object_key, None)
            self.live_uids.discard(obj["metadata"]["uid"])
        else:
            self.objects[key][object_key] = obj
            self.live_uids.add(obj["metadata"]["uid"])
        self._publish(WatchEvent(self.rv, key, event_type, clone(obj), old))
        return clone(obj)

    def _publish(self, event: WatchEvent) -> None:
        if event.type != "GONE":
            if len(self.history) == self.history.maxlen:
                self.floor = self.history[0].rv
            self.history.append(event)
        for listener in list(self.listeners):
            listener(event)

    def compact(self) -> None:
        """Forget the history up to now (as etcd compaction): older resourceVersions get 410 Gone."""
        self.history.clear()
        self.floor = self.rv

    def events_since(self, rv: int) -> list[WatchEvent]:
        if rv < self.floor:
            raise errors.gone(f"too old resource version: {rv} ({self.floor + 1})")
        return [e for e in self.history if e.rv > rv]

    # -- reading -----------------------------------------------------------------------------------------
    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        return self.render(rt, self._stored(rt, namespace, name))

    @staticmethod
    def render(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """The object as served at `rt`'s version (versions of a CRD share objects; no conversion)."""
        out = clone(obj)
        out["apiVersion"] = rt.api_version
        return out

    def list_objects(self, rt: ResourceType, namespace: str | None, matches: Callable[[dict[str, Any]], bool],
             limit: int | None = None, token: str | None = None) -> tuple[list[dict[str, Any]], str | None, int]:
        """(items, continue token, remaining count) sorted by namespace and name as etcd returns them."""
        keys = sorted(k for k in self.objects[rt.storage_key] if not rt.namespaced or namespace is None or k[0] == namespace)
        if token:
            start = tuple(json.loads(base64.b64decode(token)))
            keys = [k for k in keys if k > start]
        items = [self.objects[rt.storage_key][k] for k in keys]
        items = [obj for obj in items if matches(obj)]
        if limit and len(items) > limit:
            last = items[limit - 1]["metadata"]
            next_token = base64.b64encode(json.dumps([last.get("namespace", ""), last["name"]]).encode()).decode()
            return [self.render(rt, o) for o in items[:limit]], next_token, len(items) - limit
        return [self.render(rt, o) for o in items], None, 0

    def all_objects(self) -> Iterator[tuple[StorageKey, dict[str, Any]]]:
        for key, objs in list(self.objects.items()):
            for obj in list(objs.values()):
                yield key, obj

    # -- creating ---------------------------------------------------------------------------------------
    def create(self, rt: ResourceType, namespace: str | None, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of a create must be a JSON object")
        self._check_type_meta(rt, body)
        obj = clone(body)
        meta = {k: v for k, v in (obj.get("metadata") or {}).items()
                if k not in ("resourceVersion", "uid", "creationTimestamp", "deletionTimestamp", "selfLink",
                             "managedFields", "generation", "deletionGracePeriodSeconds")}
        obj["metadata"] = meta
        requested_name = meta.get("name") or ""  # admission sees the request's name, not a generated one
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        if rt.namespaced:
            if namespace and meta.get("namespace") and meta["namespace"] != namespace:
                raise errors.bad_request("the namespace of the provided object does not match the namespace sent on the request")
            meta["namespace"] = namespace or meta.get("namespace") or "default"
            self._check_namespace_open(meta["namespace"])
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        self._check_name(rt, meta.get("name"))
        if (meta.get("namespace", ""), meta["name"]) in self.objects[rt.storage_key]:
            raise errors.already_exists(rt.group, rt.plural, meta["name"])
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        if rt.generation:
            meta["generation"] = 1
        if rt.status_subresource:
            obj.pop("status", None)  # POST ignores status where it is a subresource
            status = initial_status(rt)
            if status is not None:
                obj["status"] = status
        if rt.storage_key == SERVICE_KEY:
            allocate_cluster_ip(obj, {(o.get("spec") or {}).get("clusterIP", "") for o in self.objects[SERVICE_KEY].values()})
        obj = self._admit(rt, obj, None)
        self._admit_user(rt, obj, None)
        self._pod_security(rt, obj)
        self.admit_policies(self._request("CREATE", rt, meta.get("namespace"), requested_name), obj, None)
        created = self._commit(rt.storage_key, "ADDED", obj, None)
        if rt.storage_key == CRD_KEY:
            self._serve_crd(created)
        refs = meta.get("ownerReferences") or []
        if refs and not self.live_uids & {ref.get("uid") for ref in refs}:
            # Every owner is already gone (a controller raced its owner's deletion): the garbage collector
            # deletes such a dangling dependent soon after; here at once, after answering its creation.
            self._delete(rt.storage_key, clone(created), "Background")
        return self.render(rt, created)

    def _check_type_meta(self, rt: ResourceType, body: dict[str, Any]) -> None:
        if body.get("apiVersion") not in (None, rt.api_version) and body.get("apiVersion") not in self._versions_of(rt):
            raise errors.bad_request(
                f"the API version in the data ({body['apiVersion']}) does not match the expected API version ({rt.api_version})")
        if body.get("kind") not in (None, rt.kind):
            raise errors.bad_request(f"the kind in the data ({body['kind']}) does not match the expected kind ({rt.kind})")

    def _versions_of(self, rt: ResourceType) -> set[str]:
        return {t.api_version for t in self.types.values() if t.storage_key == rt.storage_key}

    def _check_name(self, rt: ResourceType, name: Any) -> None:
        if not name:
            raise errors.invalid(rt.kind, rt.group, "", [{"field": "metadata.name", "reason": "FieldValueRequired",
                                                          "message": "Required value: name or generateName is required"}])
        if rt.storage_key == ("", "events"):
            return
        problems = is_dns1123_label(name) if rt.storage_key == NAMESPACE_KEY else is_dns1123_subdomain(name)
        if problems:
            raise errors.invalid(rt.kind, rt.group, name, [go_invalid("metadata.name", name, m) for m in problems])

    def _check_namespace_open(self, namespace: str) -> None:
        ns = self.objects[NAMESPACE_KEY].get(("", namespace))
        if ns is None:
            raise errors.not_found("", "namespaces", namespace)
        if ns["metadata"].get("deletionTimestamp"):
            raise errors.forbidden(
                f"unable to create new content in namespace {namespace} because it is being terminated")

    def begin_request(self, field_validation: str | None, user: authz.User | None = None) -> None:
        """Per request: how unknown fields are handled (Strict, Warn — the default — or Ignore); no warnings yet;
        the authenticated user whose rights bound what the request may write (None: anything)."""
        if field_validation not in (None, "", "Strict", "Warn", "Ignore"):
            raise errors.bad_request(f'fieldValidation must be one of "Ignore", "Warn" or "Strict", got "{field_validation}"')
        self.field_validation = field_validation or "Warn"
        self.warnings = []
        self.user = user

    # -- authorization (authz.py) ------------------------------------------------------------------------
    def allows(self, user: authz.User | None, attrs: authz.Attributes) -> bool:
        """Whether `user` holds an RBAC rule for `attrs` (always, when none is authenticated)."""
        return user is None or authz.allowed(user, attrs, self._bindings(attrs.namespace), self._role)

    def may(self, attrs: authz.Attributes) -> bool:
        return self.allows(self.user, attrs)

    def _bindings(self, namespace: str | None) -> list[dict[str, Any]]:
        return [*self.objects[CLUSTER_ROLE_BINDING_KEY].values(),
                *(b for (ns, _), b in self.objects[ROLE_BINDING_KEY].items() if ns == namespace)]

    def _role(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.objects[ROLE_KEY if kind == "Role" else CLUSTER_ROLE_KEY].get((namespace or "", name))

    def _plural_of(self, api_version: str, kind: str) -> tuple[str, str] | None:
        group = api_version.rpartition("/")[0]
        return next(((rt.group, rt.plural) for rt in self.types.values() if (rt.group, rt.kind) == (group, kind)), None)

    def _admit_user(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        """What only some users may write: ownerReferences that block an owner's deletion, and bindings of
        roles the user may neither bind nor holds (403, as the server's admission and RBAC storage refuse)."""
        if self.user is None:
            return
        meta = obj["metadata"]
        namespace = meta.get("namespace")
        target = authz.Attributes("update", rt.group, rt.plural, None, namespace, meta["name"])
        refusal = authz.owner_reference_refusals(old, obj, target, self.may, self._plural_of)
        if refusal is None and rt.storage_key in (ROLE_BINDING_KEY, CLUSTER_ROLE_BINDING_KEY):
            refusal = self._escalation(obj)
        if refusal:
            raise errors.forbidden_resource(rt.group, rt.plural, meta["name"], refusal)

    def _escalation(self, binding: dict[str, Any]) -> str | None:
        assert self.user is not None
        ref, namespace = binding["roleRef"], binding["metadata"].get("namespace")
        plural = "roles" if ref["kind"] == "Role" else "clusterroles"
        if self.may(authz.Attributes("bind", authz.RBAC_GROUP, plural, None, namespace, ref["name"])):
            return None
        role = self._role(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"]) or {}
        missing = authz.missing_rights(self.user, namespace, role.get("rules") or [], self._bindings(namespace), self._role)
        return authz.escalation_message(self.user, missing) if missing else None

    # -- ValidatingAdmissionPolicy (admission_policy.py) ----------------------------------------------------
    def _request(self, operation: str, rt: ResourceType, namespace: str | None, name: str) -> admission_policy.Request:
        return admission_policy.Request(operation, rt.group, rt.version, rt.plural, None, rt.kind,
                                        namespace if rt.namespaced else None, name, self.user)

    def admit_policies(self, request: admission_policy.Request, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        """Refuse the request as the stored ValidatingAdmissionPolicies and their bindings decide."""
        if not self.objects[POLICY_KEY]:
            return
        refused = admission_policy.refusal(self.objects[POLICY_KEY].values(), self.objects[POLICY_BINDING_KEY].values(),
                                           self._params, request, obj, old)
        if refused is not None:
            raise refused

    def _params(self, api_version: str, kind: str, namespace: str | None) -> list[dict[str, Any]]:
        mapped = self._plural_of(api_version, kind)
        if mapped is None:
            return []
        return [o for (ns, _), o in self.objects[mapped].items() if ns == (namespace or "")]

    def _unknown_fields(self, rt: ResourceType, unknown: list[str]) -> None:
        """Dropped unknown fields: refused under Strict (400, as the server's strict decoder), else a warning."""
        if not unknown:
            return
        texts = [f'unknown field "{path}"' for path in unknown]
        if self.field_validation == "Strict":
            raise errors.bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                                     f'strict decoding error: {", ".join(texts)}')
        if self.field_validation == "Warn":
            self.warnings.extend(texts)

    def _decode_builtin(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """A built-in object as the server decodes it against its kind's OpenAPI schema (400 when it cannot)."""
        try:
            decoded = decode(rt.api_version, rt.kind, obj)
        except DecodeError as e:
            raise errors.bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {e}') from None
        if decoded is None or rt.storage_key == CRD_KEY:  # a CRD's schema is checked by crd_problems
            return obj
        self._unknown_fields(rt, decoded.unknown)
        return decoded.obj

    def _pod_security(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """Pod Security admission by the namespace's labels: refuse a violating Pod (403), warn on templates."""
        namespace = self.objects[NAMESPACE_KEY].get(("", obj["metadata"].get("namespace", "")))
        if namespace is None:
            return
        refusal, warnings = pod_security.admit(rt.storage_key, obj, namespace["metadata"].get("labels") or {})
        if refusal:
            raise errors.forbidden_resource(rt.group, rt.plural, obj["metadata"]["name"], refusal)
        self.warnings.extend(warnings)

    def _admit(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        """Server-side decoding, defaulting and validation (built-in kinds: their OpenAPI schema and semantic
        rules; custom resources: their schema; CRDs; namespaces)."""
        name = obj["metadata"]["name"]
        if not rt.custom:
            obj = self._decode_builtin(rt, obj)
            causes = semantic_causes(rt.storage_key, obj)
            if causes:
                raise errors.invalid(rt.kind, rt.group, name, causes)
        if rt.storage_key == SECRET_KEY:
            normalize_secret(obj)
        if old is not None and rt.storage_key == SERVICE_KEY:
            keep_cluster_ip(old, obj)
        if old is not None and not rt.custom:
            causes = immutability_causes(rt, old, obj)
            if causes:
                raise errors.invalid(rt.kind, rt.group, name, causes)
        if rt.storage_key == NAMESPACE_KEY:
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Terminating" if obj["metadata"].get("deletionTimestamp") else "Active"}
        if rt.storage_key == CRD_KEY:
            causes = crd_problems(obj) + self._crd_rule_problems(obj)
            if causes:
                raise errors.invalid(rt.kind, rt.group, name, causes)
            obj["status"] = self._crd_status(obj)
        if rt.custom and rt.openapi_schema is not None:
            dropped: list[str] = []
            obj = prune_and_default(rt.openapi_schema, obj, root=True, dropped=dropped)
            self._unknown_fields(rt, dropped)
            causes = object_meta_causes(obj.get("metadata") or {})
            causes += validate(rt.openapi_schema, obj, "", MISSING if old is None else old, root=True)
            if causes:
                raise errors.invalid(rt.kind, rt.group, name, causes)
        return obj

    # -- updating ---------------------------------------------------------------------------------------
    @staticmethod
    def _object_key(rt: ResourceType, namespace: str | None, name: str) -> ObjectKey:
        return ((namespace or "") if rt.namespaced else "", name)

    def _stored(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self.objects[rt.storage_key].get(self._object_key(rt, namespace, name))
        if obj is None:
            raise errors.not_found(rt.group, rt.plural, name)
        return obj

    def update(self, rt: ResourceType, namespace: str | None, name: str, body: Any, subresource: str | None) -> dict[str, Any]:
        """PUT: a full replacement, guarded by metadata.resourceVersion."""
        old = self._stored(rt, namespace, name)
        if not isinstance(body, dict):
            raise errors.bad_request("the body of an update must be a JSON object")
        self._check_type_meta(rt, body)
        body_meta = body.get("metadata") or {}
        if body_meta.get("name") not in (None, name):
            raise errors.bad_request(f"the name of the object ({body_meta['name']}) does not match the name on the URL ({name})")
        if not body_meta.get("resourceVersion"):
            raise errors.invalid(rt.kind, rt.group, name, [{
                "field": "metadata.resourceVersion", "reason": "FieldValueInvalid",
                "message": "Invalid value: 0x0: must be specified for an update"}])
        if body_meta["resourceVersion"] != old["metadata"]["resourceVersion"]:
            raise errors.stale_conflict(rt.group, rt.plural, name)
        return self._write(rt, old, clone(body), subresource)

    def patch(self, rt: ResourceType, namespace: str | None, name: str, content_type: str, raw: bytes,
              subresource: str | None) -> dict[str, Any]:
        kind = content_type.split(";")[0].strip().lower()
        try:
            body = yaml.safe_load(raw) if kind == APPLY_PATCH else json.loads(raw or b"null", parse_constant=_no_constant)
            if kind == APPLY_PATCH and _has_non_finite(body):
                raise ValueError("json: unsupported value: NaN")
        except (ValueError, yaml.YAMLError) as e:
            raise errors.bad_request(f"error decoding patch: {e}") from e
        if kind == APPLY_PATCH and self._object_key(rt, namespace, name) not in self.objects[rt.storage_key]:
            return self.create(rt, namespace, body)  # server-side apply creates what is missing
        old = self._stored(rt, namespace, name)
        current = self.render(rt, old)
        if subresource == "scale":
            current = self.scale_of(rt, old)
        if kind == JSON_PATCH:
            patched = json_patch(current, body)
        elif kind in (MERGE_PATCH, APPLY_PATCH):
            patched = merge_patch(current, body)
        elif kind == STRATEGIC_MERGE_PATCH and not rt.custom:
            patched = strategic_merge_patch(current, body)
        else:
            raise errors.unsupported_media_type(content_type)
        if not isinstance(patched, dict):
            raise errors.bad_request("the patch did not produce an object")
        rv = (patched.get("metadata") or {}).get("resourceVersion")
        if rv is not None and rv != old["metadata"]["resourceVersion"]:
            raise errors.stale_conflict(rt.group, rt.plural, name)
        return self._write(rt, old, patched, subresource)

    def _write(self, rt: ResourceType, old: dict[str, Any], new: dict[str, Any], subresource: str | None) -> dict[str, Any]:
        """Apply an update/patch result to the main resource or one subresource."""
        if subresource == "scale":
            if rt.scale is None:
                raise errors.endpoint_not_found(f"{rt.plural}/scale")
            replicas = (new.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise errors.invalid("Scale", "autoscaling", old["metadata"]["name"], [{
                    "field": "spec.replicas", "reason": "FieldValueInvalid",
                    "message": f"Invalid value: {json.dumps(replicas)}: must be greater than or equal to 0"}])
            target = clone(old)
            set_path(target, rt.scale.spec_replicas, replicas)
            return self.scale_of(rt, self._replace(rt, old, target))
        if subresource == "status":
            if not rt.status_subresource:
                raise errors.endpoint_not_found(f"{rt.plural}/status")
            target = clone(old)
            if "status" in new:
                target["status"] = new["status"]
            else:
                target.pop("status", None)
            return self.render(rt, self._replace(rt, old, target))
        if subresource is not None:
            raise errors.endpoint_not_found(f"{rt.plural}/{subresource}")
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        meta = new.setdefault("metadata", {})
        for field in _SERVER_METADATA:
            if field in old["metadata"]:
                meta[field] = old["metadata"][field]
            else:
                meta.pop(field, None)
        if rt.status_subresource:  # the main resource ignores status where it is a subresource
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        self._admit_user(rt, new, old)
        if rt.storage_key != POD_KEY:  # the server re-evaluates a Pod only on changes its spec cannot have here
            self._pod_security(rt, new)
        return self.render(rt, self._replace(rt, old, new))

    def _replace(self, rt: ResourceType, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        """Store `new` in place of `old` (validated, generation bumped, no-ops skipped); returns the stored."""
        new = self._admit(rt, new, old)
        old_meta, meta = old["metadata"], new["metadata"]
        if old_meta.get("deletionTimestamp") and not set(meta.get("finalizers") or []) <= set(old_meta.get("finalizers") or []):
            raise errors.invalid(rt.kind, rt.group, meta["name"], [{
                "field": "metadata.finalizers", "reason": "FieldValueForbidden",
                "message": "Forbidden: no new finalizers can be added if the object is being deleted"}])
        if rt.generation:
            changed = _content(new, not rt.status_subresource) != _content(old, not rt.status_subresource)
            meta["generation"] = old_meta.get("generation", 1) + (1 if changed else 0)
        if not meta.get("finalizers"):
            meta.pop("finalizers", None)
        if _without_rv(new) == _without_rv(old):
            return clone(old)  # a no-op write changes nothing, not even the resourceVersion
        stored = self._commit(rt.storage_key, "MODIFIED", new, clone(old))
        if rt.storage_key == CRD_KEY:
            self._serve_crd(stored)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._remove(rt.storage_key, stored)
        return stored

    # -- scale ------------------------------------------------------------------------------------------
    def scale_of(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        if rt.scale is None:
            raise errors.endpoint_not_found(f"{rt.plural}/scale")
        meta = obj["metadata"]
        status: dict[str, Any] = {"replicas": get_path(obj, rt.scale.status_replicas) or 0}
        if rt.scale.label_selector:
            selector = get_path(obj, rt.scale.label_selector)
            if isinstance(selector, dict):
                selector = selector_string(selector)
            if selector is not None:
                status["selector"] = selector
        return {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta},
            "spec": {"replicas": get_path(obj, rt.scale.spec_replicas) or 0},
            "status": status,
        }

    # -- deleting ---------------------------------------------------------------------------------------
    def delete(self, rt: ResourceType, namespace: str | None, name: str, options: dict[str, Any]) -> dict[str, Any]:
        obj = self._stored(rt, namespace, name)
        preconditions = options.get("preconditions") or {}
        for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            if preconditions.get(field) and preconditions[field] != obj["metadata"].get(field):
                raise errors.conflict(rt.group, rt.plural, name,
                                      f"Precondition failed: {label} in precondition: {preconditions[field]}, "
                                      f"{label} in object meta: {obj['metadata'].get(field)}")
        policy = options.get("propagationPolicy") or ("Orphan" if options.get("orphanDependents") else "Background")
        self.admit_policies(self._request("DELETE", rt, namespace, name), None, self.render(rt, obj))
        return self.render(rt, self._delete(rt.storage_key, obj, policy))

    def _delete(self, key: StorageKey, obj: dict[str, Any], policy: str) -> dict[str, Any]:
        meta = obj["metadata"]
        if policy == "Orphan":
            self._orphan_dependents(meta["uid"])
        if meta.get("deletionTimestamp"):
            return clone(obj)
        if policy == "Foreground":  # dependents go first, then the owner
            self._collect_dependents(meta["uid"], only_if_gone=False)
        if key == NAMESPACE_KEY:
            return self._terminate_namespace(obj)
        if meta.get("finalizers"):
            marked = clone(obj)
            marked["metadata"]["deletionTimestamp"] = now()
            marked["metadata"]["deletionGracePeriodSeconds"] = 0
            return self._commit(key, "MODIFIED", marked, clone(obj))
        return self._remove(key, obj)

    def _remove(self, key: StorageKey, obj: dict[str, Any]) -> dict[str, Any]:
        """Remove for good, then run what depends on it: GC of dependents, namespace and CRD cleanup."""
        removed = self._commit(key, "DELETED", clone(obj), clone(obj))
        self._collect_dependents(removed["metadata"]["uid"], only_if_gone=True)
        namespace = removed["metadata"].get("namespace")
        if namespace:
            self._finish_namespace(namespace)
        if key == CRD_KEY:
            self._unserve_crd(removed)
        return removed

    def _dependents(self, owner_uid: str) -> list[tuple[StorageKey, dict[str, Any]]]:
        return [(key, obj) for key, obj in self.all_objects()
                if any(ref.get("uid") == owner_uid for ref in obj["metadata"].get("ownerReferences") or [])]

    def _collect_dependents(self, owner_uid: str, *, only_if_gone: bool) -> None:
        """Background garbage collection: a dependent whose owners are all gone is deleted (cascading)."""
        for key, dependent in self._dependents(owner_uid):
            current = self.objects[key].get((dependent["metadata"].get("namespace", ""), dependent["metadata"]["name"]))
            if current is None:
                continue
            live = self.live_uids - ({owner_uid} if only_if_gone else set())
            refs = current["metadata"].get("ownerReferences") or []
            if only_if_gone and any(ref.get("uid") in live for ref in refs):
                self._drop_owner_refs(key, current, {owner_uid})
            else:
                self._delete(key, current, "Background")

    def _orphan_dependents(self, owner_uid: str) -> None:
        for key, dependent in self._dependents(owner_uid):
            self._drop_owner_refs(key, dependent, {owner_uid})

    def _drop_owner_refs(self, key: StorageKey, obj: dict[str, Any], uids: set[str]) -> None:
        updated = clone(obj)
        refs = [r for r in updated["metadata"].get("ownerReferences") or [] if r.get("uid") not in uids]
        if refs:
            updated["metadata"]["ownerReferences"] = refs
        else:
            updated["metadata"].pop("ownerReferences", None)
        self._commit(key, "MODIFIED", updated, clone(obj))

    def _terminate_namespace(self, ns: dict[str, Any]) -> dict[str, Any]:
        """The namespace controller: mark Terminating, delete everything in it, remove it once empty."""
        name = ns["metadata"]["name"]
        marked = clone(ns)
        marked["metadata"]["deletionTimestamp"] = now()
        marked["status"] = {"phase": "Terminating"}
        result = self._commit(NAMESPACE_KEY, "MODIFIED", marked, clone(ns))
        for key, snapshot in self.all_objects():
            current = self.objects[key].get((snapshot["metadata"].get("namespace", ""), snapshot["metadata"]["name"]))
            if current is not None and current["metadata"].get("namespace") == name:
                self._delete(key, current, "Background")
        return self._finish_namespace(name) or result

    def _finish_namespace(self, name: str) -> dict[str, Any] | None:
        ns = self.objects[NAMESPACE_KEY].get(("", name))
        if ns is None or not ns["metadata"].get("deletionTimestamp") or ns["metadata"].get("finalizers"):
            return None
        if any(obj["metadata"].get("namespace") == name for _, obj in self.all_objects()):
            return None
        return self._remove(NAMESPACE_KEY, ns)

    # -- CustomResourceDefinitions -----------------------------------------------------------------------
    @staticmethod
    def _crd_rule_problems(crd: dict[str, Any]) -> list[dict[str, str]]:
        problems = []
        for n, version in enumerate((crd.get("spec") or {}).get("versions") or []):
            for rule in all_rules((version.get("schema") or {}).get("openAPIV3Schema")):
                try:
                    compile_rule(rule)
                except ValueError as e:
                    problems.append({"field": f"spec.validation.openAPIV3Schema.x-kubernetes-validations[{n}].rule",
                                     "reason": "FieldValueInvalid", "message": f"Invalid value: {json.dumps(rule)}: {e}"})
        return problems

    @staticmethod
    def _crd_status(crd: dict[str, Any]) -> dict[str, Any]:
        """What the apiextensions controllers write: names accepted, established, stored versions."""
        stamp = (crd.get("status") or {}).get("conditions", [{}])[0].get("lastTransitionTime") or now()
        storage = [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]
        stored = list(dict.fromkeys(((crd.get("status") or {}).get("storedVersions") or []) + storage))
        return {
            "acceptedNames": crd["spec"]["names"],
            "storedVersions": stored,
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": stamp},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": stamp},
            ],
        }

    def _serve_crd(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        key = (spec["group"], spec["names"]["plural"])
        stale = [k for k, rt in self.types.items() if rt.custom and rt.storage_key == key]
        for k in stale:
            del self.types[k]
        if crd["metadata"].get("deletionTimestamp"):
            return
        for rt in resource_types_of_crd(crd):
            self.types[(rt.group, rt.version, rt.plural)] = rt

    def _unserve_crd(self, crd: dict[str, Any]) -> None:
        """Deleting a CRD deletes its objects and stops serving it; open watches of it end."""
        key = (crd["spec"]["group"], crd["spec"]["names"]["plural"])
        for obj in list(self.objects[key].values()):
            self._commit(key, "DELETED", clone(obj), clone(obj))
        self.objects.pop(key, None)
        for k in [k for k, rt in self.types.items() if rt.custom and rt.storage_key == key]:
            del self.types[k]
        self._publish(WatchEvent(self.rv, key, "GONE", {}, None))
