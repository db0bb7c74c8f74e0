"""Reconcile one TrainingRun: read it and its pools -> plan -> apply children -> observe -> write status.

Terminal runs (Complete or Failed) stay terminal: their workloads are scaled to zero and nothing is
recreated; `ttlSecondsAfterFinished` then deletes the run (its children go with it, by ownerReferences).
No finalizer is ever added, so deleting a run never waits for the operator.
"""

from __future__ import annotations

import base64
import functools
import logging
import secrets
import socket
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, TypeVar

from harnessrl.operator.api import reasons as R
from harnessrl.operator.api.common import API_VERSION
from harnessrl.operator.api.enginepool import KIND as ENGINE_POOL_KIND
from harnessrl.operator.api.enginepool import EnginePoolSpec
from harnessrl.operator.api.harnesspool import HarnessPoolSpec
from harnessrl.operator.api.manifest import format_errors
from harnessrl.operator.api.trainingrun import KIND, TrainingRunSpec, TrainingRunStatus
from harnessrl.operator.control.apply import (
    ChildConflict,
    ChildRefused,
    Kube,
    Snapshot,
    deferred_change,
    ensure_child,
    owner_uid,
)
from harnessrl.operator.handlers import admission
from harnessrl.operator.handlers.claims import claim_holder
from harnessrl.operator.handlers.context import Context
from harnessrl.operator.handlers.status import (
    Event,
    Observed,
    blocked_status,
    engine_pool_held,
    is_terminal,
    run_status,
    transitions,
)
from harnessrl.operator.kube import Owner, engine, learner, proxy, render, storage
from harnessrl.operator.kube.common import COMPONENT, MANAGED_BY, POOL, RUN, selector
from harnessrl.operator.kube.learner import JOBSET_API, JOBSET_GROUP_VERSION
from harnessrl.operator.plan import build_plan
from harnessrl.operator.plan.names import child_name, engine_pool_store_secret
from harnessrl.operator.plan.placement import ClusterPlacement
from harnessrl.operator.plan.pools import pool_names, pool_share
from harnessrl.operator.plan.types import ComponentKind, Plan, PlanError
from harnessrl.runtime.contracts.status import fetch
from pydantic import BaseModel, ValidationError

log = logging.getLogger("harnessrl.operator.trainingrun")
Manifest = dict[str, Any]
S = TypeVar("S", bound=BaseModel)

# Every kind of child a run has (all carry the run's instance label) but its Secrets: the operator may read a
# Secret only by name (no list or watch).
CHILD_KINDS = [
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("v1", "PersistentVolumeClaim"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "Deployment"),
    ("batch/v1", "Job"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
]


def spec_problems(exc: ValidationError, spec: Any) -> str:
    """A model's complaints about a stored spec, one `spec.field: problem` each, in the manifest's names."""
    return "; ".join(f"spec.{line}" for line in format_errors(exc, spec))[:2000]


def read_status(model: type[S], body: Manifest) -> S | None:
    """The typed status of `body`, ignoring keys others (kopf) keep there."""
    raw = body.get("status") or {}
    names = {f.alias or n for n, f in model.model_fields.items()}
    known = {k: v for k, v in raw.items() if k in names and k != "kopf"}
    try:
        return model.model_validate(known) if known else None
    except ValidationError:
        log.warning("ignoring unreadable status of %s", body["metadata"].get("name"))
        return None


def write_status(kube: Kube, kind: str, body: Manifest, old: BaseModel | None, new: BaseModel) -> bool:
    dump = new.model_dump(mode="json", by_alias=True, exclude={"kopf"}, exclude_none=True)
    if old is not None and old.model_dump(mode="json", by_alias=True, exclude={"kopf"}, exclude_none=True) == dump:
        return False
    meta = body["metadata"]
    kube.write_status(kind, meta["namespace"], meta["name"], dump)
    return True


def post_events(kube: Kube, body: Manifest, events: list[Event]) -> None:
    """Kubernetes Events on the run (what `kubectl describe` shows). Best effort: never fails a reconcile."""
    meta = body["metadata"]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for event in events:
        manifest = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": body["apiVersion"],
                "kind": body["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message,
            "source": {"component": MANAGED_BY},
            "reportingComponent": MANAGED_BY,
            "reportingInstance": socket.gethostname()[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            kube.create(manifest)
        except Exception as exc:  # an Event is informational; losing one is better than failing the reconcile
            log.warning("could not post event %s on %s: %s", event.reason, meta["name"], exc)


def reconcile(ctx: Context, namespace: str, name: str) -> None:
    kube = ctx.kube
    body = kube.get(API_VERSION, KIND, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return
    generation = int(body["metadata"].get("generation") or 0)
    old = read_status(TrainingRunStatus, body)
    try:
        spec = TrainingRunSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        # The CRD's schema rejects this at the API server; an older object may still fail the current model.
        _finish(kube, body, old, blocked_status(generation, old, R.INVALID_SPEC, spec_problems(exc, body.get("spec"))))
        return
    if is_terminal(old):
        _finished(ctx, body, spec, old)
        return
    pools: dict[str, HarnessPoolSpec] = {}
    invalid: list[str] = []
    wanted = pool_names(spec)  # trained on and evaluated under
    for pool_name in wanted:
        pool = kube.get(API_VERSION, "HarnessPool", namespace, pool_name)
        if pool is not None:
            try:
                pools[pool_name] = HarnessPoolSpec.model_validate(pool.get("spec") or {})
            except ValidationError as exc:  # stored before an upgrade; the pool carries the same condition
                invalid.append(f"HarnessPool {pool_name} is invalid: {spec_problems(exc, pool.get('spec'))}")
    if invalid:
        _finish(kube, body, old, blocked_status(generation, old, R.INVALID_HARNESS_POOL, "; ".join(invalid)))
        return
    # A pool's replicas are its runners across every run using it: this run runs its share.
    pools = {n: p.model_copy(update={"replicas": pool_share(p.replicas, ctx.pool_users(namespace, n), name)})
             for n, p in pools.items()}
    engine_pool: EnginePoolSpec | None = None
    if spec.engine.pool is not None and (found := kube.get(API_VERSION, ENGINE_POOL_KIND, namespace, spec.engine.pool)):
        try:
            engine_pool = EnginePoolSpec.model_validate(found.get("spec") or {})
        except ValidationError as exc:  # stored before an upgrade; the pool carries the same condition
            message = f"EnginePool {spec.engine.pool} is invalid: {spec_problems(exc, found.get('spec'))}"
            _finish(kube, body, old, blocked_status(generation, old, R.ENGINE_POOL_UNAVAILABLE, message))
            return
    placement = ClusterPlacement(namespace)
    try:
        plan = build_plan(name, namespace, spec, pools, placement, ctx.options.images, engine_pool)
    except PlanError as exc:
        reason = R.HARNESS_POOL_NOT_FOUND if len(pools) < len(wanted) else exc.reason
        _finish(kube, body, old, blocked_status(generation, old, reason, str(exc)))
        return
    if plan.learner.replicas > 1 and not kube.serves(JOBSET_GROUP_VERSION):
        message = (f"learner.nodes {plan.learner.replicas} runs the learner as a JobSet, and this cluster does not "
                   f"serve {JOBSET_API}: install JobSet (kubernetes-sigs/jobset) or set learner.nodes to 1")
        _finish(kube, body, old, blocked_status(generation, old, R.JOBSET_NOT_INSTALLED, message))
        return
    if plan.checkpoint_claim and (unshared := storage.unshared_claim(
            plan, kube.get("v1", "PersistentVolumeClaim", namespace, plan.checkpoint_claim))) is not None:
        _finish(kube, body, old, blocked_status(generation, old, R.CHECKPOINT_CLAIM_NOT_SHARED, unshared))
        return
    if (missing := admission.kueue_missing(kube, spec.queue_name, "the run")) is not None:
        _finish(kube, body, old, blocked_status(generation, old, R.KUEUE_NOT_INSTALLED, missing))
        return
    owner = Owner(name=name, uid=body["metadata"]["uid"])
    if plan.checkpoint_claim is not None:
        claim = kube.get("v1", "PersistentVolumeClaim", namespace, plan.checkpoint_claim)
        held = claim_holder(claim, name, owner.uid, kube.list_objects(API_VERSION, KIND, namespace, {}))
        if held is not None:
            message = (f"spec.learner.checkpointClaimName: claim {plan.checkpoint_claim} belongs to {held}, which "
                       "is still live: name a claim of your own, or one a deleted run retained")
            _finish(kube, body, old, blocked_status(generation, old, R.CHECKPOINT_CLAIM_IN_USE, message))
            return
    key = (namespace, name)
    version = (owner.uid, generation)
    if not ctx.refusals.due(key, version):
        return  # a child was refused for this generation; wait out the backoff (the condition says why)
    try:
        rendering = functools.partial(render, operator_namespace=ctx.options.operator_namespace)
        gate = admission.gate(kube, plan, owner, rendering) if spec.queue_name else None
        applied = apply_children(kube, gate.plan if gate else plan, owner, ctx.options.operator_namespace)
    except (ChildRefused, ChildConflict) as refused:
        # Refused: only a spec change cures it. Conflict: so does the other object going away; both retry with backoff.
        delay = ctx.refusals.failed(key, version)
        log.warning("TrainingRun %s/%s: %s; retrying in %.0f s", namespace, name, refused, delay)
        reason = R.CHILD_CONFLICT if isinstance(refused, ChildConflict) else R.CHILD_REFUSED
        _finish(kube, body, old, blocked_status(generation, old, reason, str(refused)[:4000]))
        return
    ctx.refusals.succeeded(key)
    observed = observe(plan, applied.snapshot, kube.list_objects("v1", "Pod", namespace, {RUN: name}))
    observed = observed.model_copy(update={"deferred": applied.deferred})
    if plan.engine_pool is not None:
        observed = observed.model_copy(update=observe_engine_pool(kube, namespace, plan.engine_pool))
    if gate is not None:
        observed = observed.model_copy(update={"queue": gate.queue})
        admission.release(kube, gate, observed.pods)
    if int(((observed.learner or {}).get("status") or {}).get("active") or 0) >= 1:
        url = ctx.options.learner_url_template.format(run=name, namespace=namespace) or placement.coordinator_url(name)
        progress = fetch(url)
        if progress is not None:
            ctx.progress[(namespace, name)] = progress
        observed = observed.model_copy(update={"progress": progress})
    new = run_status(spec, generation, old, observed)
    _finish(kube, body, old, new)
    ctx.usage[(namespace, name)] = new.usage
    post_events(kube, body, applied.replaced)
    if is_terminal(new):
        scale_to_zero(kube, namespace, name, owner.uid)
        finish_workload(kube, body, spec, new)


def active_pools(body: Manifest) -> set[str]:
    """The pools a run takes runners from: none once it is suspended or finished (or its spec is unreadable)."""
    try:
        spec = TrainingRunSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return set()
    if spec.suspend or is_terminal(read_status(TrainingRunStatus, body)):
        return set()
    return set(pool_names(spec))


class Applied(NamedTuple):
    snapshot: Snapshot  # what exists afterwards (for observing)
    replaced: list[Event]  # one for each child replaced (one that could not take the change in place)
    deferred: list[str]  # what a running child takes only when it next starts (apply.deferred_change)


def apply_children(kube: Kube, plan: Plan, owner: Owner, operator_namespace: str) -> Applied:
    """Converge every child on the plan."""
    kinds = child_kinds(plan)
    snapshot = kube.snapshot(plan.namespace, {RUN: plan.run}, kinds)
    # Generated once and kept (a Secret's data is never patched): the proxy admin token (proxy, learner, runners)
    # and the runner token (learner checks, runners send).
    for generated in (proxy.admin_secret, learner.runner_secret):
        ensure_child(kube, generated(plan, owner, secrets.token_urlsafe(32)))
    if plan.engine_pool is not None:
        ensure_store_credential(kube, plan, owner, plan.engine_pool)
    changed = False
    replaced: list[Event] = []
    manifests = render(plan, owner, operator_namespace)
    for manifest in manifests:
        outcome = ensure_child(kube, manifest, snapshot)
        changed |= outcome.action != "unchanged"
        if outcome.action == "replaced":
            what = f"{manifest['kind']} {manifest['metadata']['name']}"
            replaced.append(Event(type="Warning", reason=R.CHILD_REPLACED, message=f"replaced {what}: {outcome.why}"[:1024]))
    wanted = {c.pool for c in plan.runners}
    for (api_version, kind, name), child in snapshot.items():
        labels = child["metadata"].get("labels") or {}
        # A pool the run no longer uses; its own engine once it samples from an EnginePool.
        stale = (labels.get(COMPONENT) == str(ComponentKind.RUNNER) and labels.get(POOL) not in wanted) or (
            labels.get(COMPONENT) == str(ComponentKind.ENGINE) and plan.engine is None)
        if stale and owner_uid(child) == owner.uid:
            changed |= kube.delete(api_version, kind, plan.namespace, name)
    if changed:
        snapshot = kube.snapshot(plan.namespace, {RUN: plan.run}, kinds)
    deferred = [why for m in manifests
                if (live := snapshot.get((m["apiVersion"], m["kind"], m["metadata"]["name"]))) is not None
                and (why := deferred_change(m, live)) is not None]
    return Applied(snapshot, replaced, deferred)


def ensure_store_credential(kube: Kube, plan: Plan, owner: Owner, pool: str) -> None:
    """The run's own credential at its EnginePool's adapter stores, derived from the pool's token once the pool has
    made it (until then the learner's Pod waits for the Secret)."""
    secret = kube.get("v1", "Secret", plan.namespace, engine_pool_store_secret(pool))
    if secret is not None:
        token = base64.b64decode(secret["data"]["token"]).decode()
        ensure_child(kube, engine.run_store_credential(plan, owner, token))


def child_kinds(plan: Plan) -> list[tuple[str, str]]:
    # JobSets are listed only where the run has one: without the CRD, listing them is a 404.
    return [*CHILD_KINDS, (JOBSET_API, "JobSet")] if plan.learner.replicas > 1 else CHILD_KINDS


def observe(plan: Plan, snapshot: Snapshot, pods: list[Manifest]) -> Observed:
    return Observed(
        engine=snapshot.get(("apps/v1", "StatefulSet", plan.engine.name)) if plan.engine else None,
        proxy=snapshot.get(("apps/v1", "StatefulSet", plan.proxy.name)),
        learner=snapshot.get(("batch/v1", "Job", plan.learner.name)) or jobset_as_job(snapshot.get((JOBSET_API, "JobSet", plan.learner.name))),
        runners={c.pool or "": snapshot.get(("apps/v1", "Deployment", c.name)) for c in plan.runners},
        pods=pods,
    )


def observe_engine_pool(kube: Kube, namespace: str, pool: str) -> dict[str, Any]:
    """The servers of the EnginePool a run samples from, as its engine, and whether Kueue holds them back
    (Observed fields)."""
    name = child_name(pool, ComponentKind.ENGINE_POOL)
    return {"engine": kube.get("apps/v1", "StatefulSet", namespace, name),
            "engine_pods": kube.list_objects("v1", "Pod", namespace, selector(pool, ComponentKind.ENGINE_POOL)),
            "engine_pool_held": engine_pool_held(pool, kube.get(API_VERSION, ENGINE_POOL_KIND, namespace, pool))}


def jobset_as_job(jobset: Manifest | None) -> Manifest | None:
    """A JobSet's status in a Job's terms (active Pods' Jobs; Completed -> Complete, Failed -> Failed)."""
    if jobset is None:
        return None
    status = jobset.get("status") or {}
    names = {"Completed": "Complete", "Failed": "Failed"}
    conditions = [c | {"type": names[c.get("type")]} for c in status.get("conditions") or [] if c.get("type") in names]
    active = sum(int(r.get("active") or 0) for r in status.get("replicatedJobsStatus") or [])
    return {**jobset, "status": {"active": active, "conditions": conditions}}


def scale_to_zero(kube: Kube, namespace: str, run: str, uid: str) -> None:
    """Free a finished run's GPUs and sandboxes (only its own workloads); its checkpoints and Job stay for inspection."""
    workloads = [("apps/v1", "StatefulSet", child_name(run, ComponentKind.ENGINE)), ("apps/v1", "StatefulSet", child_name(run, ComponentKind.PROXY))]
    workloads += [
        ("apps/v1", "Deployment", d["metadata"]["name"])
        for d in kube.list_objects("apps/v1", "Deployment", namespace, {RUN: run, COMPONENT: str(ComponentKind.RUNNER)})
    ]
    for api_version, kind, name in workloads:
        live = kube.get(api_version, kind, namespace, name)
        if live is not None and owner_uid(live) == uid and (live.get("spec") or {}).get("replicas", 1) != 0:
            kube.patch(api_version, kind, namespace, name, {"spec": {"replicas": 0}})


def finish_workload(kube: Kube, body: Manifest, spec: TrainingRunSpec, status: TrainingRunStatus) -> None:
    """A finished run's Workload is marked Finished, so Kueue gives its quota to others."""
    if spec.queue_name:
        complete = next((c for c in status.conditions if c.type == R.COMPLETE and c.status == "True"), None)
        failed = next((c for c in status.conditions if c.type == R.FAILED and c.status == "True"), None)
        said = complete or failed
        admission.finish(kube, body["metadata"]["namespace"], body["metadata"]["name"], complete is not None,
                         said.message if said else "")


def _finished(ctx: Context, body: Manifest, spec: TrainingRunSpec, old: TrainingRunStatus | None) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    generation = int(meta.get("generation") or 0)
    scale_to_zero(ctx.kube, namespace, name, meta["uid"])
    new = run_status(spec, generation, old, Observed())
    _finish(ctx.kube, body, old, new)
    ctx.usage[(namespace, name)] = new.usage
    finish_workload(ctx.kube, body, spec, new)
    ttl, done = spec.ttl_seconds_after_finished, new.completion_time
    if ttl is not None and done is not None and datetime.now(UTC) >= done + timedelta(seconds=ttl):
        log.info("deleting TrainingRun %s/%s: finished %s, ttlSecondsAfterFinished %d", namespace, name, done, ttl)
        ctx.kube.delete(API_VERSION, KIND, namespace, name)


def _finish(kube: Kube, body: Manifest, old: TrainingRunStatus | None, new: TrainingRunStatus) -> None:
    if write_status(kube, KIND, body, old, new):
        post_events(kube, body, transitions(old.conditions if old else [], new.conditions))
