"""TrainingRun + its HarnessPools (+ EnginePool) -> Plan: the components of a run and their rendered configs;
EnginePool -> EnginePoolPlan: its servers. Pure.

The plan is computed once and realised two ways: `harnessrl.operator.kube` turns it into manifests, the
local runner (`harnessrl run`) into processes. What differs between the two (URLs, ports, paths inside the
container or under a run directory) is a `Placement`; everything else (which components, their configs,
replicas, resources, images) is decided here, from the spec alone.

One module per component, as in `harnessrl.operator.kube`: engine.py (a run's own servers or an EnginePool's,
and the adapter store), proxy.py, learner.py, runner.py. Apart from them: types.py (Plan, Component, the errors),
placement.py (Placement and its path table), names.py (children, generated Secrets, labels), secret_files.py
(Secrets read as files), pools.py (which pools a run uses) and memory.py (learner memory admission). This module
puts a run's components together (`build_plan`).
"""

from __future__ import annotations

from harnessrl.operator.api.enginepool import EnginePoolSpec
from harnessrl.operator.api.harnesspool import HarnessPoolSpec
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.plan.engine import adapter_store_plan, engine_component, engine_target
from harnessrl.operator.plan.learner import learner_component
from harnessrl.operator.plan.names import child_name, runner_token_secret
from harnessrl.operator.plan.placement import Placement
from harnessrl.operator.plan.pools import pool_names
from harnessrl.operator.plan.proxy import proxy_component
from harnessrl.operator.plan.runner import runner_component
from harnessrl.operator.plan.types import Admissible, ComponentKind, Images, Plan, PlanError, TooManyPodSets
from pydantic import ValidationError

MAX_POD_SETS = 8  # Kueue's limit on a Workload's spec.podSets: learner, engine, proxy and one per pool


def build_plan(
    run: str,
    namespace: str,
    spec: TrainingRunSpec,
    pools: dict[str, HarnessPoolSpec],
    placement: Placement,
    images: Images | None = None,
    engine_pool: EnginePoolSpec | None = None,
) -> Plan:
    """The components of `run`. `pools` must hold every pool `spec.harnesses` and `spec.eval` name, and
    `engine_pool` the EnginePool `spec.engine.pool` names (None: it does not exist)."""
    try:
        return _build(run, namespace, spec, pools, placement, images or Images(), engine_pool)
    except ValidationError as exc:
        # A combination the API allows but a component's config does not (e.g. image tasks, local sandbox).
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise PlanError(f"{exc.title} for run {run}: {problems}") from exc


def _build(
    run: str, namespace: str, spec: TrainingRunSpec, pools: dict[str, HarnessPoolSpec], placement: Placement,
    images: Images, engine_pool: EnginePoolSpec | None,
) -> Plan:
    missing = sorted(name for name in pool_names(spec) if name not in pools)
    if missing:
        raise PlanError(f"HarnessPool {', '.join(missing)} not found in namespace {namespace}")
    used = {name: pools[name] for name in pool_names(spec)}
    too_long = sorted(name for name in used if len(name) > 63)
    if too_long:
        raise PlanError(f"HarnessPool name {', '.join(too_long)} is longer than 63 characters: it labels runner Pods")
    own = 2 if spec.engine.pool else 3  # learner, proxy (and engine)
    if spec.queue_name and own + len(used) > MAX_POD_SETS:
        raise TooManyPodSets(f"spec.queueName: a Kueue Workload holds at most {MAX_POD_SETS} pod sets, and this run has "
                             f"{own + len(used)} ({own} of its own and {len(used)} pools): use at most "
                             f"{MAX_POD_SETS - own} pools in a queued run")
    if spec.engine.pool is not None and engine_pool is not None:
        # The pool's servers set the context length that the memory plan and Dr. GRPO's constant assume.
        engine = spec.engine.model_copy(update={"max_model_len": engine_pool.engine.max_model_len})
        spec = spec.model_copy(update={"engine": engine})
    admin_secret = child_name(run, ComponentKind.PROXY) + "-admin"
    adapter_store = adapter_store_plan(run, spec, placement, images, admin_secret)
    target = engine_target(run, namespace, spec, placement, adapter_store, engine_pool)
    return Plan(
        run=run,
        namespace=namespace,
        suspended=spec.suspend,
        engine=engine_component(run, spec, placement),
        engine_pool=spec.engine.pool,
        adapter_store=adapter_store,
        proxy=proxy_component(run, spec, placement, images, admin_secret, target),
        learner=learner_component(run, spec, used, placement, images, admin_secret, target),
        runners=[runner_component(run, namespace, spec, name, pool, placement, images) for name, pool in used.items()],
        proxy_admin_secret=admin_secret,
        runner_token_secret=runner_token_secret(run),
        checkpoint_claim=spec.learner.checkpoint_claim_name,
        restart_budget=spec.learner.restart_budget,
        spec=spec,
        pools=used,
    )


def stopped(plan: Admissible) -> Admissible:
    """The plan with no Pod running (a suspended run, or a run or pool Kueue has not admitted): its workloads at
    zero replicas and a run's learner Job suspended (kube/common.py running_replicas). Configs stay as they are."""
    return plan.model_copy(update={"suspended": True})
