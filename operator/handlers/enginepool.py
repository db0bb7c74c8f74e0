"""Reconcile one EnginePool: read -> plan -> admit (with spec.queueName) -> apply its servers -> write status
(readiness, the runs on it).

The servers run whether or not a run uses the pool: a platform team sizes the pool for its teams' runs. With
spec.queueName they run only while Kueue admits the pool's Workload (handlers/admission.py, as a run's). A spec
change (e.g. more replicas) triggers the runs in its namespace, which point their proxies and learners at the
servers the pool now has."""

from __future__ import annotations

import functools
import logging
import secrets

from harnessrl.operator.api import reasons as R
from harnessrl.operator.api.common import API_VERSION
from harnessrl.operator.api.enginepool import KIND, EnginePoolSpec, EnginePoolStatus
from harnessrl.operator.api.trainingrun import KIND as RUN_KIND
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.control.apply import ChildConflict, ChildRefused, Kube, ensure_child
from harnessrl.operator.handlers import adapters, admission
from harnessrl.operator.handlers.context import Context
from harnessrl.operator.handlers.status import engine_pool_status, pool_blocked_status
from harnessrl.operator.handlers.trainingrun import Manifest, read_status, spec_problems, write_status
from harnessrl.operator.kube import Owner, engine
from harnessrl.operator.kube.common import selector
from harnessrl.operator.plan.engine import build_engine_pool_plan
from harnessrl.operator.plan.placement import ClusterPlacement
from harnessrl.operator.plan.types import ComponentKind, PlanError
from pydantic import ValidationError

log = logging.getLogger("harnessrl.operator.enginepool")


def reconcile(ctx: Context, namespace: str, name: str) -> None:
    kube = ctx.kube
    body = kube.get(API_VERSION, KIND, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return
    generation = int(body["metadata"].get("generation") or 0)
    old = read_status(EnginePoolStatus, body)
    try:
        spec = EnginePoolSpec.model_validate(body.get("spec") or {})
        plan = build_engine_pool_plan(name, namespace, spec, ClusterPlacement(namespace), ctx.options.images)
    except ValidationError as exc:  # stored before an upgrade: say so on the pool (its runs say it too)
        _blocked(kube, body, old, generation, R.INVALID_SPEC, spec_problems(exc, body.get("spec")))
        return
    except PlanError as exc:
        _blocked(kube, body, old, generation, exc.reason, str(exc))
        return
    if (missing := admission.kueue_missing(kube, spec.queue_name, "the pool's servers")) is not None:
        _blocked(kube, body, old, generation, R.KUEUE_NOT_INSTALLED, missing)
        return
    owner = Owner(name=name, uid=body["metadata"]["uid"], kind=KIND)
    try:
        for generated in (engine.store_secret, engine.api_key_secret):  # generated once and kept
            ensure_child(kube, generated(plan, owner, secrets.token_urlsafe(32)))
        rendering = functools.partial(engine.pool_manifests, operator_namespace=ctx.options.operator_namespace)
        gate = admission.gate(kube, plan, owner, rendering) if spec.queue_name else None
        for manifest in rendering(gate.plan if gate else plan, owner):
            ensure_child(kube, manifest)
    except (ChildRefused, ChildConflict) as refused:
        log.warning("EnginePool %s/%s: %s", namespace, name, refused)
        reason = R.CHILD_CONFLICT if isinstance(refused, ChildConflict) else R.CHILD_REFUSED
        _blocked(kube, body, old, generation, reason, str(refused)[:4000])
        return
    servers = kube.get("apps/v1", "StatefulSet", namespace, plan.engine.name)
    pods = kube.list_objects("v1", "Pod", namespace, selector(name, ComponentKind.ENGINE_POOL))
    if gate is not None:
        admission.release(kube, gate, pods)
    runs = runs_on(kube.list_objects(API_VERSION, RUN_KIND, namespace, {}), name)
    new = engine_pool_status(generation, old, servers, pods, runs, gate.queue if gate else None)
    write_status(kube, KIND, body, old, new)
    ctx.pool_usage[(namespace, name)] = new.usage
    if new.ready_replicas:  # servers still starting have nothing loaded, and would only time out
        adapters.collect(kube, plan, runs, ctx.options)


def runs_on(runs: list[Manifest], pool: str) -> list[str]:
    """The names of the runs among `runs` whose spec.engine.pool is `pool` (unreadable specs are on none)."""
    names = []
    for run in runs:
        try:
            spec = TrainingRunSpec.model_validate(run.get("spec") or {})
        except ValidationError:
            continue
        if spec.engine.pool == pool:
            names.append(run["metadata"]["name"])
    return sorted(names)


def _blocked(kube: Kube, body: Manifest, old: EnginePoolStatus | None, generation: int, reason: str, message: str) -> None:
    write_status(kube, KIND, body, old, pool_blocked_status(generation, old or EnginePoolStatus(), reason, message))
