"""Create-or-patch children with the official kubernetes client: idempotent, restart-safe, no duplicates.

Children have deterministic names, so "does it exist" is one GET, and a create racing another create
gets 409 and falls back to a patch. A child is patched only when the desired fields differ from the live
object (drift), and only in fields Kubernetes lets change after creation.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, NamedTuple
from urllib.parse import urlencode

import kubernetes.client
from harnessrl.operator.api.common import API_VERSION, COMPONENT_LABEL, POOL_LABEL, RUN_LABEL, RUN_UID_LABEL
from harnessrl.operator.kube.common import SCHEDULING_DIRECTIVES, TEMPLATE_HASH
from kubernetes.client.exceptions import ApiException

if TYPE_CHECKING:
    from harnessrl.operator.control.cache import ChildCache

Manifest = dict[str, Any]
Snapshot = dict[tuple[str, str, str], Manifest]  # (apiVersion, kind, name) -> live object
log = logging.getLogger("harnessrl.operator.apply")

MERGE_PATCH = "application/merge-patch+json"

# (apiVersion, kind) -> plural, for every kind the operator creates or reads.
PLURALS: dict[tuple[str, str], str] = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Secret"): "secrets",
    ("v1", "Service"): "services",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("apps/v1", "Deployment"): "deployments",
    ("batch/v1", "Job"): "jobs",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobsets",
    ("kueue.x-k8s.io/v1beta1", "Workload"): "workloads",
    ("kueue.x-k8s.io/v1beta1", "ResourceFlavor"): "resourceflavors",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("coordination.k8s.io/v1", "Lease"): "leases",
    ("harnessrl.io/v1alpha1", "TrainingRun"): "trainingruns",
    ("harnessrl.io/v1alpha1", "HarnessPool"): "harnesspools",
    ("harnessrl.io/v1alpha1", "EnginePool"): "enginepools",
}

# Spec fields that may change after creation; the rest is immutable (or owned by another controller).
MUTABLE_SPEC: dict[str, set[str] | None] = {
    "StatefulSet": {"replicas", "template", "updateStrategy", "minReadySeconds", "persistentVolumeClaimRetentionPolicy"},
    "Deployment": {"replicas", "template", "strategy", "minReadySeconds"},
    "Job": {"suspend", "parallelism", "activeDeadlineSeconds"},  # a Job's Pod template is fixed once created
    "JobSet": {"suspend"},
    "Workload": {"active"},  # its pod sets are immutable: a change replaces it (handlers/admission.py)
    "Service": {"ports", "selector", "publishNotReadyAddresses", "type"},
    "PersistentVolumeClaim": set(),
    "NetworkPolicy": None,  # None = the whole spec
}
# Kinds whose content is never patched after creation, only their labels and ownerReferences: a Secret's
# generated value must stay; a claim's size and class are the storage's.
CREATE_ONLY = {"Secret", "PersistentVolumeClaim"}
# The labels a workload finds its Pods by (kube/common.py selector()).
SELECTOR_KEYS = (RUN_LABEL, COMPONENT_LABEL, POOL_LABEL)


class Outcome(NamedTuple):
    """What `Kube.ensure` did to one child, and why when it replaced it."""

    action: Literal["created", "patched", "unchanged", "replaced"]
    why: str = ""


class ChildConflict(Exception):
    """An object with a child's name exists and belongs to someone else: it is neither adopted nor changed."""

    def __init__(self, kind: str, name: str, holder: str) -> None:
        super().__init__(f"{kind} {name} already exists and belongs to {holder}; the operator leaves it alone: "
                         f"delete or rename it (or the run)")


class ChildRefused(Exception):
    """The API server refused to create or update a child (`refused_as_is`): the spec cannot be realised as is."""

    def __init__(self, kind: str, name: str, exc: ApiException) -> None:
        super().__init__(f"the API server refused {kind} {name}: {server_message(exc)}")


def server_message(exc: ApiException) -> str:
    """The message of the Status object an API error carries (its reason when the body is not one)."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or f"{exc.status} {exc.reason}")


def owner_uid(manifest: Manifest) -> str | None:
    """The uid of the run (or other controller) the object belongs to: its controller ownerReference's, or
    for an object made to outlive its run (a retained checkpoint claim), its run-uid label's."""
    meta = manifest["metadata"]
    refs = meta.get("ownerReferences") or []
    controller = next((str(r["uid"]) for r in refs if r.get("controller")), None)
    return controller or (None if refs else (meta.get("labels") or {}).get(RUN_UID_LABEL))


def holder(desired: Manifest, live: Manifest) -> str | None:
    """Who holds the live object, when that is not the desired object's owner; None when it is ours."""
    mine = owner_uid(desired)
    refs = live["metadata"].get("ownerReferences") or []
    if mine is None or any(str(r.get("uid")) == mine for r in refs) or owner_uid(live) == mine:
        return None
    other = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    labels = live["metadata"].get("labels") or {}
    if other is None and labels.get(RUN_UID_LABEL):
        return (f"the run {labels.get(RUN_LABEL)} uid {labels[RUN_UID_LABEL]}, which kept it when it was deleted "
                "(checkpointRetention Retain)")
    if other is None:
        return "no owner (made by hand, or orphaned from an earlier owner)"
    ours: Manifest = next((r for r in desired["metadata"].get("ownerReferences") or [] if r.get("controller")), {})
    same_name = (other.get("kind"), other.get("name")) == (ours.get("kind"), ours.get("name"))
    earlier = " (an earlier object of that name)" if same_name else ""
    return f"{other.get('kind')} {other.get('name')} uid {other.get('uid')}{earlier}"


def path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    plural = PLURALS[(api_version, kind)]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{scope}/{plural}" + (f"/{name}" if name else "")


def patch_body(desired: Manifest) -> Manifest:
    """The part of `desired` the operator keeps converged on a live object."""
    kind = desired["kind"]
    meta = desired["metadata"]
    body: Manifest = {"metadata": {"labels": meta.get("labels", {}), "ownerReferences": meta.get("ownerReferences", [])}}
    if kind in CREATE_ONLY:
        return body
    for key, value in desired.items():
        if key in ("apiVersion", "kind", "metadata", "status"):
            continue
        if key == "spec" and kind in MUTABLE_SPEC:
            allowed = MUTABLE_SPEC[kind]
            body["spec"] = value if allowed is None else {k: v for k, v in value.items() if k in allowed}
        elif key == "roleRef":
            continue
        else:
            body[key] = value
    return body


# A suspended Job's (or JobSet's) Pod template may change where its Pods go (SCHEDULING_DIRECTIVES), as long as
# it has not started since (Kubernetes resets a suspended Job's startTime): that is how a run Kueue admits gets its
# flavor's nodes (kube/kueue.py place()), and how an evicted one gives them back.

def _with_removals(want: Manifest, have: Manifest) -> Manifest:
    """A merge patch of a map: `want`, and null for each key only `have` holds (a merge patch keeps those)."""
    return want | {key: None for key in have if key not in want}


def _scheduling(want: Manifest, have: Manifest) -> Manifest:
    """The mutable part of a suspended workload's Pod template, as a merge patch from `have` to `want`."""
    meta = {k: _with_removals(want["metadata"].get(k) or {}, have.get("metadata", {}).get(k) or {})
            for k in ("labels", "annotations")}
    spec = {f: want["spec"].get(f) for f in SCHEDULING_DIRECTIVES}  # None removes a field
    spec["nodeSelector"] = _with_removals(want["spec"].get("nodeSelector") or {}, have.get("spec", {}).get("nodeSelector") or {})
    return {"metadata": meta, "spec": spec}


def _may_move(live: Manifest) -> bool:
    """Whether a live Job's or JobSet's Pod placement may change: suspended, and not started since."""
    return bool((live.get("spec") or {}).get("suspend")) and not (live.get("status") or {}).get("startTime")


def suspended_template_patch(desired: Manifest, live: Manifest) -> Manifest | None:
    """The spec patch that moves a suspended, not started Job's or JobSet's Pod template to where `desired`
    schedules it; None for other kinds and for a running workload (its template is fixed)."""
    if not _may_move(live):
        return None
    live_spec = live.get("spec") or {}
    if desired["kind"] == "Job":
        return {"template": _scheduling(desired["spec"]["template"], live_spec.get("template") or {})}
    if desired["kind"] == "JobSet":
        # replicatedJobs is a list, which a merge patch replaces whole: the live entries, with only their Pod
        # templates' scheduling directives (and labels, annotations) taken from the desired ones.
        jobs = []
        for want, have in zip(desired["spec"]["replicatedJobs"], live_spec.get("replicatedJobs") or [], strict=False):
            want_pod, have_pod = want["template"]["spec"]["template"], have["template"]["spec"]["template"]
            pod_spec = {k: v for k, v in have_pod["spec"].items() if k not in SCHEDULING_DIRECTIVES}
            pod_spec |= {k: want_pod["spec"][k] for k in SCHEDULING_DIRECTIVES if k in want_pod["spec"]}
            pod = {**have_pod, "metadata": {**have_pod.get("metadata", {}), **{k: want_pod["metadata"].get(k, {})
                                                                              for k in ("labels", "annotations")}},
                   "spec": pod_spec}
            jobs.append({**have, "template": {**have["template"], "spec": {**have["template"]["spec"], "template": pod}}})
        return {"replicatedJobs": jobs}
    return None


def _pod_template(manifest: Manifest) -> Manifest:
    """A workload's Pod template (a JobSet's: its first replicated Job's)."""
    spec = manifest.get("spec") or {}
    if manifest["kind"] == "JobSet":
        jobs = spec.get("replicatedJobs") or [{}]
        spec = ((jobs[0].get("template") or {}).get("spec")) or {}
    template: Manifest = spec.get("template") or {}
    return template


def _pod_template_labels(manifest: Manifest) -> dict[str, str]:
    labels: dict[str, str] = (_pod_template(manifest).get("metadata") or {}).get("labels") or {}
    return labels


def deferred_change(desired: Manifest, live: Manifest) -> str | None:
    """What a running Job (or JobSet) cannot take of `desired`: its Pods' placement (SCHEDULING_DIRECTIVES), which
    only a suspended Job that has not started since may change. None when it has nothing to wait for."""
    if desired["kind"] not in ("Job", "JobSet") or _may_move(live):
        return None
    want, have = _pod_template(desired).get("spec") or {}, _pod_template(live).get("spec") or {}
    moved = [f for f in SCHEDULING_DIRECTIVES if (drifted(want[f], have.get(f)) if want.get(f) else bool(have.get(f)))]
    if not moved:
        return None
    return (f"{desired['kind']} {desired['metadata']['name']} keeps its Pods' {', '.join(moved)} while it runs: the "
            "new placement applies when it next starts (suspend and resume the run to apply it now)")


def replacement_reason(desired: Manifest, live: Manifest) -> str | None:
    """Why the live object must be deleted and recreated, when it differs from the desired one in a field
    Kubernetes will not update: a StatefulSet's or Deployment's selector, a Job's or JobSet's Pod template
    labels (e.g. made by an operator version that selected on other labels), a RoleBinding's roleRef (one
    bound to a per-pool Role, before the sandbox ClusterRole). None: patch it."""
    kind = desired["kind"]
    if kind == "RoleBinding":
        have = live.get("roleRef")
        return None if desired["roleRef"] == have else f"its roleRef {json.dumps(have, sort_keys=True)} cannot change"
    if kind in ("StatefulSet", "Deployment"):
        want, have = desired["spec"].get("selector"), (live.get("spec") or {}).get("selector")
        return None if want == have else f"its selector {json.dumps(have, sort_keys=True)} cannot change"
    if kind in ("Job", "JobSet"):
        want = {k: v for k, v in _pod_template_labels(desired).items() if k in SELECTOR_KEYS}
        have = _pod_template_labels(live)
        missing = sorted(f"{k}={v}" for k, v in want.items() if have.get(k) != v)
        if missing:
            return f"its Pod template (which cannot change) lacks the labels {', '.join(missing)}"
        # A Job made before the digest existed has none: it is kept, not restarted by an operator upgrade.
        digest = (live["metadata"].get("annotations") or {}).get(TEMPLATE_HASH)
        if digest is not None and digest != desired["metadata"]["annotations"][TEMPLATE_HASH]:
            return ("its Pod template changed (the learner's config, image, resources or command), which a Job "
                    "cannot take: the learner restarts from its latest checkpoint")
        return None
    return None


_SUFFIX_SCALE: dict[str, Decimal] = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    **{s: Decimal(10) ** (3 * (n + 1)) for n, s in enumerate("kMGTPE")},
    **{f"{s}i": Decimal(2) ** (10 * (n + 1)) for n, s in enumerate("KMGTPE")},
}
# A number, then an exponent (1e3) or a suffix: "1E" is one exa, not an exponent.
_QUANTITY_TEXT = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+)|([a-zA-Z]*))")


def quantity_value(value: Any) -> Decimal | None:
    """The amount a Kubernetes quantity stands for (the server stores 0.5 as "500m"); None if it is none."""
    match = _QUANTITY_TEXT.fullmatch(str(value).strip())
    if match is None or isinstance(value, bool):
        return None
    number, exponent, suffix = Decimal(match.group(1)), match.group(2), match.group(3)
    if exponent is not None:
        return number.scaleb(int(exponent))
    scale = _SUFFIX_SCALE.get(suffix)
    return None if scale is None else number * scale


def _same_quantity(desired: Any, live: Any) -> bool:
    amount = quantity_value(desired)
    return amount is not None and amount == quantity_value(live)


def drifted(desired: Any, live: Any, key: str = "") -> bool:
    """True when some value in `desired` is missing or different in `live` (extra live fields are fine:
    the API server adds defaults; resource amounts compare as quantities)."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return True
        if key in ("limits", "requests"):
            return any(not _same_quantity(value, live.get(name)) and drifted(value, live.get(name))
                       for name, value in desired.items())
        return any(drifted(value, live.get(name), name) for name, value in desired.items())
    if isinstance(desired, list):
        if not desired and live is None:  # the server leaves an empty list out
            return False
        if not isinstance(live, list) or len(desired) != len(live):
            return True
        return any(drifted(d, l_) for d, l_ in zip(desired, live, strict=True))
    if (isinstance(desired, (int, float)) and isinstance(live, str)) or (isinstance(desired, str) and isinstance(live, (int, float))):
        return str(desired) != str(live)
    return bool(desired != live)


class Kube:
    """A thin JSON-over-HTTP layer on `kubernetes.client.ApiClient` for any kind in PLURALS. With a `cache`,
    LISTs of the kinds it holds are answered from it, and writes of them go into it (cache.py)."""

    def __init__(self, api: kubernetes.client.ApiClient, timeout: float = 10.0) -> None:
        self.api = api
        self.timeout = timeout
        self.cache: ChildCache | None = None
        # The resourceVersion of each object's last status write by this operator: its watch event is no news.
        self._own_status: dict[tuple[str, str, str], str] = {}
        self._own_mu = threading.Lock()

    def write_status(self, kind: str, namespace: str, name: str, status: Manifest) -> None:
        written = self.patch_status(API_VERSION, kind, namespace, name, status)
        with self._own_mu:
            self._own_status[(kind, namespace, name)] = str(written.get("metadata", {}).get("resourceVersion", ""))

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """The object is gone: drop the record of its last status write (it would grow with every run ever seen)."""
        with self._own_mu:
            self._own_status.pop((kind, namespace, name), None)

    def is_own_status_write(self, kind: str, namespace: str, name: str, resource_version: str | None) -> bool:
        """Whether this version of the object is the one this operator's last status write made."""
        with self._own_mu:
            return bool(resource_version) and self._own_status.get((kind, namespace, name)) == resource_version

    def _send(self, method: str, url: str, body: Any = None, content_type: str | None = None,
              timeout: float | tuple[float, float] | None = None) -> Any:
        """The response, its body unread; an error status raises ApiException."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        method, full_url, headers, serialized, _ = self.api.param_serialize(
            method=method, resource_path=url, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        response = self.api.call_api(method, full_url, header_params=headers, body=serialized,
                                     _request_timeout=timeout or self.timeout)
        if response.status >= 400:
            response.read()
            raise ApiException(http_resp=response)
        return response

    def request(self, method: str, url: str, body: Any = None, *, content_type: str | None = None) -> Manifest:
        result: Manifest = json.loads(self._send(method, url, body, content_type).read() or b"{}")
        return result

    def stream(self, url: str, read_timeout: float) -> Any:
        """GET a watch: the response, its body unread (`.response` yields one JSON event per line)."""
        return self._send("GET", url, timeout=(self.timeout, read_timeout))

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Manifest | None:
        try:
            return self.request("GET", path(api_version, kind, namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def serves(self, group_version_path: str) -> bool:
        """Whether the API server serves this group/version (discovery: a CRD that is not installed is a 404)."""
        try:
            self.request("GET", group_version_path)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def list_objects(self, api_version: str, kind: str, namespace: str, selector: dict[str, str]) -> list[Manifest]:
        if self.cache is not None and (cached := self.cache.select(api_version, kind, namespace, selector)) is not None:
            return cached
        query = urlencode({"labelSelector": ",".join(f"{k}={v}" for k, v in sorted(selector.items()))})
        items: list[Manifest] = self.request("GET", f"{path(api_version, kind, namespace)}?{query}").get("items") or []
        return items

    def create(self, manifest: Manifest) -> Manifest:
        meta = manifest["metadata"]
        return self._wrote(self.request("POST", path(manifest["apiVersion"], manifest["kind"], meta["namespace"]), manifest))

    def replace(self, manifest: Manifest) -> Manifest:
        """PUT: a compare-and-swap on the manifest's resourceVersion (409 when another writer came first)."""
        meta = manifest["metadata"]
        return self._wrote(self.request("PUT", path(manifest["apiVersion"], manifest["kind"], meta.get("namespace"), meta["name"]),
                                        manifest))

    def patch(self, api_version: str, kind: str, namespace: str, name: str, body: Manifest) -> Manifest:
        return self._wrote(self.request("PATCH", path(api_version, kind, namespace, name), body, content_type=MERGE_PATCH))

    def _wrote(self, answer: Manifest) -> Manifest:
        if self.cache is not None:
            self.cache.wrote(answer)
        return answer

    def patch_status(self, api_version: str, kind: str, namespace: str, name: str, status: Manifest) -> Manifest:
        return self.request("PATCH", path(api_version, kind, namespace, name) + "/status", {"status": status},
                            content_type=MERGE_PATCH)

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        if self.cache is not None:
            self.cache.deleted(api_version, kind, namespace, name)
        try:
            self.request("DELETE", path(api_version, kind, namespace, name), {"propagationPolicy": "Background"})
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def snapshot(self, namespace: str, selector: dict[str, str], kinds: list[tuple[str, str]]) -> Snapshot:
        """Every object of `kinds` matching `selector`: one LIST per kind instead of one GET per object."""
        return {
            (api_version, kind, obj["metadata"]["name"]): obj
            for api_version, kind in kinds
            for obj in self.list_objects(api_version, kind, namespace, selector)
        }

    def ensure(self, desired: Manifest, snapshot: Snapshot | None = None) -> Outcome:
        """Create `desired`, or converge the live object on it: created / patched / unchanged, or replaced
        (deleted and created again) when the live workload selects its Pods by other labels (replacement_reason).
        Raises ChildConflict, changing nothing, when the live object belongs to another owner.

        With a `snapshot` (taken by label, so it holds every labelled child), an object absent from it is
        taken as absent from the cluster; a stale snapshot costs at most a 409 and a GET.
        """
        api_version, kind = desired["apiVersion"], desired["kind"]
        namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
        if snapshot is not None:
            live = snapshot.get((api_version, kind, name))
        else:
            live = self.get(api_version, kind, namespace, name)
        if live is None:
            try:
                self.create(desired)
                return Outcome("created")
            except ApiException as exc:
                if exc.status != 409:
                    raise
                # Another reconcile (or an operator replica) created it between our GET and POST.
                live = self.get(api_version, kind, namespace, name)
                if live is None:
                    raise
        other = holder(desired, live)
        if other is not None:
            raise ChildConflict(kind, name, other)
        why = replacement_reason(desired, live)
        if why is not None:
            # Background: the object goes now, its Pods after it (the garbage collector); a create that still
            # finds it (a finalizer holds it) is retried by the next reconcile.
            self.delete(api_version, kind, namespace, name)
            try:
                self.create(desired)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            log.info("replaced %s %s/%s: %s", kind, namespace, name, why)
            return Outcome("replaced", why)
        body = patch_body(desired)
        if (template := suspended_template_patch(desired, live)) is not None:
            body["spec"] = body.get("spec", {}) | template
        if not drifted(body, live):
            return Outcome("unchanged")
        self.patch(api_version, kind, namespace, name, body)
        log.info("converged %s %s/%s", kind, namespace, name)
        return Outcome("patched")


def ensure_child(kube: Kube, manifest: Manifest, snapshot: Snapshot | None = None) -> Outcome:
    """`kube.ensure`, with a refusal no retry can cure (the server will not take the object as it is) raised as
    ChildRefused."""
    try:
        return kube.ensure(manifest, snapshot)
    except ApiException as exc:
        if refused_as_is(exc):
            raise ChildRefused(manifest["kind"], manifest["metadata"]["name"], exc) from None
        raise


def refused_as_is(exc: ApiException) -> bool:
    """400, 403, 422; 413 (a request body above the server's 3 MiB); and an object above etcd's 1.5 MiB, which
    the server passes on as a 500 with etcd's message (any other 500 may pass)."""
    too_large_for_etcd = exc.status == 500 and server_message(exc) == "etcdserver: request is too large"
    return exc.status in (400, 403, 413, 422) or too_large_for_etcd
