"""Children's state -> a run's (or pool's) status: conditions with stable reasons, phase, progress. Pure.

Condition types of a TrainingRun: EngineReady, ProxyReady, HarnessesReady, Ready (all three), Training,
Suspended, Complete, Failed. Reasons are part of the API (alerts and scripts match on them); each is defined
and documented once in operator/api/reasons.py and listed in the API reference (operator/api/README.md).

`Complete` comes from the learner's Job succeeding: the learner exits 0 only after its last step (and its
final checkpoint and export), so a Job success is the run's success. `Failed` comes from the Job failing
(the restart budget is its backoffLimit).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, TypeVar

from harnessrl.operator.api import reasons as R
from harnessrl.operator.api.common import COMPONENT_LABEL, POOL_LABEL
from harnessrl.operator.api.enginepool import EnginePoolStatus, PoolUsage
from harnessrl.operator.api.harnesspool import HarnessPoolStatus, PoolRolloutCounts
from harnessrl.operator.api.reasons import (
    COMPLETE,
    ENGINE_READY,
    FAILED,
    HARNESSES_READY,
    PROXY_READY,
    READY,
    SPEC_APPLIED,
    SUSPENDED,
    TRAINING,
)
from harnessrl.operator.api.status import Condition, ConditionStatus, set_condition, status_time
from harnessrl.operator.api.trainingrun import RolloutCounts, RunUsage, TrainingRunSpec, TrainingRunStatus
from harnessrl.runtime.contracts.coordinator import CoordinatorStatus
from harnessrl.runtime.contracts.learner_exit import parse_termination_message
from pydantic import BaseModel, ConfigDict

Manifest = dict[str, Any]

# Kubernetes's own container reasons, mapped onto ours (api/reasons.py).
IMAGE_PULL = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
CONFIG_ERRORS = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
GPU = "nvidia.com/gpu"
# The reasons an EnginePool's Ready condition gives while Kueue holds its servers back.
KUEUE_HOLDS = {R.AWAITING_ADMISSION, R.EVICTED_BY_KUEUE, R.KUEUE_NOT_INSTALLED}
# GPU time is written at most once a minute per run: a status write on every reconcile would load the API server.
USAGE_PERIOD_S = 60.0


class Trouble(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: str
    message: str


class QueueState(BaseModel):
    """A run's (or EnginePool's) Kueue Workload as last read: admitted, or why not (a reason of api/reasons.py)."""

    admitted: bool
    reason: str = ""
    message: str = ""


class Observed(BaseModel):
    """The children of a run as last read from the API (None = absent)."""

    engine: Manifest | None = None
    proxy: Manifest | None = None
    learner: Manifest | None = None  # the Job (of a multi-node learner: its JobSet, seen as a Job)
    runners: dict[str, Manifest | None] = {}  # pool -> Deployment
    engine_pods: list[Manifest] | None = None  # an EnginePool's servers; None: the run's own engine's, among pods
    engine_pool_held: Trouble | None = None  # why Kueue holds the EnginePool's servers back (its Ready condition)
    pods: list[Manifest] = []
    progress: CoordinatorStatus | None = None
    queue: QueueState | None = None  # None: the run has no spec.queueName
    deferred: list[str] = []  # what running children take only when they next start


class Event(BaseModel):
    model_config = ConfigDict(frozen=True)

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def pod_trouble(pods: list[Manifest]) -> Trouble | None:
    """The first problem a user must act on among `pods` (by name, so the answer is stable)."""
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
                message = cond.get("message", "")
                reason = R.INSUFFICIENT_GPU if GPU in message else R.UNSCHEDULABLE
                return Trouble(reason=reason, message=f"pod {name}: {message}")
        for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            why = waiting.get("reason", "")
            detail = f"pod {name} container {cs.get('name')}: {why}" + (f": {waiting['message']}" if waiting.get("message") else "")
            if why in IMAGE_PULL:
                return Trouble(reason=R.IMAGE_PULL_BACK_OFF, message=detail)
            if why == "CrashLoopBackOff":
                return Trouble(reason=R.CRASH_LOOP_BACK_OFF, message=detail)
            if why in CONFIG_ERRORS:
                return Trouble(reason=R.CONFIG_ERROR, message=detail)
    return None


def _pods_of(pods: list[Manifest], component: str, pool: str | None = None) -> list[Manifest]:
    def match(pod: Manifest) -> bool:
        labels = pod["metadata"].get("labels") or {}
        return labels.get(COMPONENT_LABEL) == component and (pool is None or labels.get(POOL_LABEL) == pool)

    return [p for p in pods if match(p)]


def workload_condition(workload: Manifest | None, pods: list[Manifest], what: str) -> tuple[ConditionStatus, str, str]:
    """(status, reason, message) of a StatefulSet or Deployment and its Pods."""
    if workload is None:
        return "False", R.CREATING, f"{what} is being created"
    want = int((workload.get("spec") or {}).get("replicas", 1))
    ready = int((workload.get("status") or {}).get("readyReplicas") or 0)
    if want == 0:
        return "False", R.SUSPENDED_REASON, f"{what} is scaled to zero"
    if ready >= want:
        return "True", R.ALL_REPLICAS_READY, f"{what}: {ready}/{want} replicas ready"
    trouble = pod_trouble(pods)
    if trouble is not None:
        return "False", trouble.reason, trouble.message
    return "False", R.REPLICAS_NOT_READY, f"{what}: {ready}/{want} replicas ready"


def _job_condition(job: Manifest | None, kind: str) -> Manifest | None:
    for cond in ((job or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def _is_true(conditions: list[Condition], type_: str) -> bool:
    return any(c.type == type_ and c.status == "True" for c in conditions)


def is_terminal(status: TrainingRunStatus | None) -> bool:
    return status is not None and (_is_true(status.conditions, COMPLETE) or _is_true(status.conditions, FAILED))


def run_status(
    spec: TrainingRunSpec,
    generation: int,
    old: TrainingRunStatus | None,
    observed: Observed,
    now: datetime | None = None,
) -> TrainingRunStatus:
    """The run's new status from its children. A terminal run stays terminal."""
    now = status_time(now)
    old = old or TrainingRunStatus()
    conds = list(old.conditions)

    def put(type_: str, status: ConditionStatus, reason: str, message: str) -> None:
        nonlocal conds
        conds = set_condition(conds, type_, status, reason, message, generation, now)

    finished = is_terminal(old)
    complete = _job_condition(observed.learner, "Complete")
    failed = _job_condition(observed.learner, "Failed")
    if not finished and complete:
        put(COMPLETE, "True", R.TRAINING_COMPLETE, f"the learner finished {spec.grpo.steps} steps")
        put(FAILED, "False", R.TRAINING_COMPLETE, "")
        finished = True
    elif not finished and failed:
        reason = {"BackoffLimitExceeded": R.RESTART_BUDGET_EXHAUSTED,
                  "DeadlineExceeded": R.DEADLINE_EXCEEDED}.get(failed.get("reason") or "", R.LEARNER_FAILED)
        detail = failed.get("message") or "the learner failed"
        # A learner that ended itself with a reason (runtime/contracts/learner_exit.py) left it in its termination log.
        if (said := learner_termination(_pods_of(observed.pods, "learner"))) is not None:
            reason, detail = said
        put(FAILED, "True", reason, f"{detail} (restart budget {spec.learner.restart_budget})")
        put(COMPLETE, "False", reason, "")
        finished = True
    elif not finished:
        put(COMPLETE, "False", R.TRAINING_NOT_FINISHED, "")
        put(FAILED, "False", R.NO_FAILURE, "")

    pods = observed.pods
    if not finished:  # a finished run's spec changes nothing any more: the condition keeps its last word
        if observed.deferred:
            put(SPEC_APPLIED, "False", R.APPLIES_AT_NEXT_START, "; ".join(observed.deferred)[:4000])
        else:
            put(SPEC_APPLIED, "True", R.SPEC_IN_EFFECT, f"generation {generation} is in effect")
    if finished:
        for type_ in (ENGINE_READY, PROXY_READY, HARNESSES_READY, READY, TRAINING):
            put(type_, "False", R.RUN_FINISHED, "the run has finished; its Pods are scaled to zero")
        put(SUSPENDED, "False", R.RUN_FINISHED, "")
    elif spec.suspend:
        for type_ in (ENGINE_READY, PROXY_READY, HARNESSES_READY, READY, TRAINING):
            put(type_, "False", R.SUSPENDED_REASON, "the run is suspended")
        put(SUSPENDED, "True", R.SUSPENDED_BY_USER, "Pods scaled to zero; checkpoints kept")
    elif (queue := observed.queue) is not None and not queue.admitted:
        for type_ in (ENGINE_READY, PROXY_READY, HARNESSES_READY, READY, TRAINING):
            put(type_, "False", queue.reason, queue.message)
        put(SUSPENDED, "False", queue.reason, queue.message)
    else:
        put(SUSPENDED, "False", R.NOT_SUSPENDED, "")
        engine_pods = observed.engine_pods if observed.engine_pods is not None else _pods_of(pods, "engine")
        engine = workload_condition(observed.engine, engine_pods, "engine")
        held = observed.engine_pool_held
        # Servers at zero (or not there yet) on a pool Kueue holds back: the pool's reason says when they come.
        if held is not None and engine[1] in (R.SUSPENDED_REASON, R.CREATING):
            engine = ("False", held.reason, held.message)
        put(ENGINE_READY, *engine)
        put(PROXY_READY, *workload_condition(observed.proxy, _pods_of(pods, "proxy"), "proxy"))
        put(HARNESSES_READY, *_harnesses_condition(observed, pods))
        parts = [c for c in conds if c.type in (ENGINE_READY, PROXY_READY, HARNESSES_READY)]
        # Trouble first: a crash-looping proxy matters more than an engine that is still starting.
        not_ready = sorted((c for c in parts if c.status != "True"), key=lambda c: c.reason not in R.WARNING_REASONS)
        if not_ready:
            put(READY, "False", not_ready[0].reason, f"{not_ready[0].type}: {not_ready[0].message}")
        else:
            put(READY, "True", R.ALL_COMPONENTS_READY, "engine, proxy and harness runners are ready")
        put(TRAINING, *_training_condition(spec, observed, pods))

    training_now = _is_true(conds, TRAINING)
    status = old.model_copy(
        update={
            "conditions": conds,
            "observed_generation": generation,
            "phase": _phase(conds),
            "start_time": old.start_time or (now if training_now else None),
            "completion_time": old.completion_time or (now if finished else None),
            "usage": run_usage(old.usage, observed, now),
        }
    )
    progress = observed.progress
    if progress is not None:
        status = status.model_copy(
            update={
                "step": progress.step,
                "policy_version": progress.policy_version,
                "rollouts": RolloutCounts(
                    scored=progress.rollouts_scored, unscored=progress.rollouts_unscored, stale=progress.rollouts_stale
                ),
                "mean_reward": progress.mean_reward if progress.mean_reward is not None else old.mean_reward,
                "pass_at1": progress.pass_at1 or old.pass_at1,
                "latest_checkpoint": progress.latest_checkpoint or old.latest_checkpoint,
                "hub_revision": progress.hub_revision or old.hub_revision,
            }
        )
    return status


def pod_gpus(pod: Manifest) -> int:
    """GPUs a Pod holds: its containers' nvidia.com/gpu limits (requests, where no limit is set)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        res = container.get("resources") or {}
        total += int((res.get("limits") or {}).get(GPU) or (res.get("requests") or {}).get(GPU) or 0)
    return total


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def gpu_time(pods: list[Manifest], since: datetime | None, now: datetime) -> tuple[dict[str, float], datetime | None]:
    """GPU-seconds of the running GPU Pods among `pods` from `since` (or their start) to `now`, by component label,
    and the time counted up to. Counted at most once per USAGE_PERIOD_S and only while a GPU Pod runs, so that a
    quiet object causes no status writes: otherwise ({}, since)."""
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running" and pod_gpus(p) > 0]
    if not running or (since is not None and (now - since).total_seconds() < USAGE_PERIOD_S):
        return {}, since
    added: dict[str, float] = {}
    for pod in running:
        started = _time((pod.get("status") or {}).get("startTime")) or now
        begin = max(started, since) if since is not None else started
        component = (pod["metadata"].get("labels") or {}).get(COMPONENT_LABEL, "")
        added[component] = added.get(component, 0.0) + pod_gpus(pod) * max(0.0, (now - begin).total_seconds())
    return added, now


def run_usage(old: RunUsage, observed: Observed, now: datetime) -> RunUsage:
    """Usage with GPU time counted up to `now` (gpu_time) and the learner's counters (never lower than already
    said)."""
    own = [p for p in observed.pods if (p["metadata"].get("labels") or {}).get(COMPONENT_LABEL) in ("learner", "engine")]
    added, observed_time = gpu_time(own, old.observed_time, now)
    gpu: dict[str, float] = {component: s for component, s in old.gpu_seconds.items()}
    for component, seconds in added.items():
        gpu[component] = round(gpu.get(component, 0.0) + seconds, 1)
    usage = old.model_copy(update={"gpu_seconds": gpu, "observed_time": observed_time})
    progress = observed.progress
    if progress is None:
        return usage
    pools = progress.pools.values()
    return usage.model_copy(update={
        "rollouts": max(old.rollouts, sum(p.completed + p.failed + p.timed_out for p in pools)),
        "sandbox_seconds": max(old.sandbox_seconds, round(sum(p.sandbox_seconds for p in pools), 1)),
        "tokens_sampled": max(old.tokens_sampled, sum(p.sampled_tokens for p in pools)),
        "tokens_trained": max(old.tokens_trained, progress.tokens_trained),
    })


def learner_termination(pods: list[Manifest]) -> tuple[str, str] | None:
    """(reason, message) from the newest learner Pod's termination message, if the learner wrote one."""
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "", reverse=True):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (cs.get("state") or {}).get("terminated") or {}
            if cs.get("name") == "learner" and (said := parse_termination_message(terminated.get("message") or "")):
                return said
    return None


def _harnesses_condition(observed: Observed, pods: list[Manifest]) -> tuple[ConditionStatus, str, str]:
    for pool, deployment in sorted(observed.runners.items()):
        result = workload_condition(deployment, _pods_of(pods, "runner", pool), f"runners of pool {pool}")
        if result[0] != "True":
            return result
    return "True", R.ALL_REPLICAS_READY, f"runners of {len(observed.runners)} pool(s) ready"


def _training_condition(spec: TrainingRunSpec, observed: Observed, pods: list[Manifest]) -> tuple[ConditionStatus, str, str]:
    job = observed.learner
    ready = int(((job or {}).get("status") or {}).get("ready") or 0)
    progress = observed.progress
    if ready >= 1:
        step = f"step {progress.step}/{spec.grpo.steps}, policy v{progress.policy_version}" if progress else "starting"
        if progress is not None and (e := progress.evaluating) is not None:
            step += f", evaluating step {e.step} ({e.finished}/{e.rollouts} rollouts)"
        if progress is not None and progress.export_error:
            return "True", R.HUB_EXPORT_FAILING, f"{step}; Hub export failing: {progress.export_error}"
        if progress is not None and progress.eval_regressions:
            fallen = "; ".join(r.describe() for r in progress.eval_regressions)
            return "True", R.EVAL_REGRESSED, f"{step}; {fallen}"
        return "True", R.TRAINING_REASON, step
    trouble = pod_trouble(_pods_of(pods, "learner"))
    if trouble is not None:
        return "False", trouble.reason, trouble.message
    return "False", R.WAITING_FOR_LEARNER, "the learner is not running yet"


def _phase(conds: list[Condition]) -> Literal["Pending", "Running", "Suspended", "Succeeded", "Failed"]:
    if _is_true(conds, FAILED):
        return "Failed"
    if _is_true(conds, COMPLETE):
        return "Succeeded"
    if _is_true(conds, SUSPENDED):
        return "Suspended"
    if _is_true(conds, TRAINING):
        return "Running"
    return "Pending"


def blocked_status(
    generation: int, old: TrainingRunStatus | None, reason: str, message: str, now: datetime | None = None
) -> TrainingRunStatus:
    """The status of a run whose spec cannot be realised (a missing pool, an unsupported combination)."""
    old = old or TrainingRunStatus()
    conds = set_condition(list(old.conditions), READY, "False", reason, message, generation, now)
    conds = set_condition(conds, TRAINING, "False", reason, message, generation, now)
    return old.model_copy(update={"conditions": conds, "observed_generation": generation, "phase": "Pending"})


def transitions(old: list[Condition], new: list[Condition]) -> list[Event]:
    """An Event for each condition whose status or reason changed (messages only, never secrets)."""
    before = {c.type: (c.status, c.reason) for c in old}
    events = []
    for cond in new:
        previous = before.get(cond.type)
        if previous == (cond.status, cond.reason):
            continue
        kind: Literal["Normal", "Warning"] = "Warning" if cond.reason in R.WARNING_REASONS else "Normal"
        # Complete/Failed False is bookkeeping; a False that is not trouble is news only when it ends a True
        # (e.g. resumed: Suspended True -> False).
        if cond.status != "True" and (
            cond.type in (COMPLETE, FAILED)
            or cond.reason in (R.RUN_FINISHED, R.SUSPENDED_REASON)  # consequences of an announced transition
            or (kind == "Normal" and (previous or ("",))[0] != "True")
        ):
            continue
        text = f"{cond.type} is {cond.status}" + (f": {cond.message}" if cond.message else "")
        events.append(Event(type=kind, reason=cond.reason, message=text[:1024]))
    return events


def pool_status(
    generation: int,
    old: HarnessPoolStatus | None,
    name: str,
    deployments: list[Manifest],
    pods: list[Manifest],
    rollouts: PoolRolloutCounts,
    now: datetime | None = None,
) -> HarnessPoolStatus:
    """A pool's status: its runner replicas across the runs using it, readiness, rollout counters."""
    old = old or HarnessPoolStatus()
    replicas = sum(int((d.get("status") or {}).get("replicas") or 0) for d in deployments)
    ready = sum(int((d.get("status") or {}).get("readyReplicas") or 0) for d in deployments)
    want = sum(int((d.get("spec") or {}).get("replicas") or 0) for d in deployments)
    if not deployments:
        cond: tuple[ConditionStatus, str, str] = ("False", R.NOT_IN_USE, "no TrainingRun uses this pool")
        phase: Literal["Pending", "Ready", "Degraded"] = "Pending"
    elif ready >= want:
        cond, phase = ("True", R.ALL_REPLICAS_READY, f"{ready}/{want} runners ready"), "Ready"
    else:
        trouble = pod_trouble(pods)
        reason, message = (trouble.reason, trouble.message) if trouble else (R.REPLICAS_NOT_READY, f"{ready}/{want} runners ready")
        cond, phase = ("False", reason, message), ("Degraded" if ready else "Pending")
    conds = set_condition(list(old.conditions), READY, *cond, generation=generation, now=now)
    return old.model_copy(
        update={
            "conditions": conds,
            "observed_generation": generation,
            "phase": phase,
            "replicas": replicas,
            "ready_replicas": ready,
            "selector": f"{COMPONENT_LABEL}=runner,{POOL_LABEL}={name}",
            "rollouts": rollouts,
        }
    )


PoolStatus = TypeVar("PoolStatus", HarnessPoolStatus, EnginePoolStatus)


def pool_blocked_status(
    generation: int, old: PoolStatus, reason: str, message: str, now: datetime | None = None
) -> PoolStatus:
    """The status of a pool (harness or engine) whose stored spec the operator cannot use."""
    conds = set_condition(list(old.conditions), READY, "False", reason, message, generation, now)
    return old.model_copy(update={"conditions": conds, "observed_generation": generation, "phase": "Pending"})


def engine_pool_status(
    generation: int,
    old: EnginePoolStatus | None,
    servers: Manifest | None,
    pods: list[Manifest],
    runs: list[str],
    queue: QueueState | None = None,
    now: datetime | None = None,
) -> EnginePoolStatus:
    """An EnginePool's status: its servers' readiness (or why Kueue holds them back: `queue`, None when the pool
    is not queued), the runs sampling from it, and its servers' GPU time (gpu_time)."""
    old = old or EnginePoolStatus()
    ready = int(((servers or {}).get("status") or {}).get("readyReplicas") or 0)
    phase: Literal["Pending", "Ready", "Degraded"]
    if queue is not None and not queue.admitted:
        cond: tuple[ConditionStatus, str, str] = ("False", queue.reason, queue.message)
        phase = "Pending"
    else:
        cond = workload_condition(servers, pods, "servers")
        phase = "Ready" if cond[0] == "True" else ("Degraded" if ready else "Pending")
    conds = set_condition(list(old.conditions), READY, *cond, generation=generation, now=now)
    added, observed_time = gpu_time(pods, old.usage.observed_time, status_time(now))
    usage = PoolUsage(gpu_seconds=round(old.usage.gpu_seconds + sum(added.values()), 1), observed_time=observed_time)
    return old.model_copy(update={"conditions": conds, "observed_generation": generation, "phase": phase,
                                  "ready_replicas": ready, "runs": runs, "usage": usage})


def engine_pool_held(pool: str, body: Manifest | None) -> Trouble | None:
    """Why Kueue holds an EnginePool's servers back, from its Ready condition; None when it does not."""
    conditions = ((body or {}).get("status") or {}).get("conditions") or []
    ready: Manifest = next((c for c in conditions if c.get("type") == READY), {})
    if ready.get("status") == "True" or ready.get("reason") not in KUEUE_HOLDS:
        return None
    return Trouble(reason=ready["reason"], message=f"EnginePool {pool} awaits Kueue's admission: {ready.get('message', '')}")
