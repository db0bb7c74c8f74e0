"""Children's state -> conditions, phase, progress and Events (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from harnessrl.operator.api.harnesspool import PoolRolloutCounts
from harnessrl.operator.api.trainingrun import TrainingRunSpec, TrainingRunStatus
from harnessrl.operator.handlers.status import (
    Observed,
    blocked_status,
    engine_pool_status,
    pool_status,
    run_status,
    transitions,
)
from harnessrl.runtime.contracts.coordinator import CoordinatorStatus, EvalRegression

SPEC = TrainingRunSpec.model_validate({
    "model": {"base": {"hub": {"repo": "a/b"}}},
    "tasks": {"hub": {"repo": "a/t"}},
    "harnesses": [{"pool": "p"}],
    "grpo": {"steps": 10},
})
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ready(replicas: int = 1) -> dict[str, Any]:
    return {"spec": {"replicas": replicas}, "status": {"readyReplicas": replicas}}


def pod(component: str, status: dict[str, Any], name: str = "x-0") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"harnessrl.io/component": component}}, "status": status}


def learner_status(**fields: Any) -> CoordinatorStatus:
    """A coordinator status with the counters a test does not care about at zero."""
    zero = {"open_groups": 0, "ready_groups": 0, "leased": 0, "rollouts_scored": 0, "rollouts_unscored": 0,
            "rollouts_stale": 0, "groups_skipped_zero_variance": 0, "policy_model": "m", "done": False}
    return CoordinatorStatus.model_validate(zero | fields)


def conds(status: Any) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_pending_then_training_with_progress() -> None:
    first = run_status(SPEC, 1, None, Observed(engine=ready(), proxy=ready(), runners={"p": ready()}), T0)
    assert conds(first)["Ready"] == ("True", "AllComponentsReady")
    assert conds(first)["Training"] == ("False", "WaitingForLearner") and first.phase == "Pending"
    progress = learner_status(step=4, policy_version=4, rollouts_scored=32, mean_reward=0.4, pass_at1={"p": 0.5})
    job = {"status": {"active": 1, "ready": 1}}
    second = run_status(SPEC, 1, first, Observed(engine=ready(), proxy=ready(), runners={"p": ready()}, learner=job,
                                                 progress=progress), T0 + timedelta(seconds=5))
    assert conds(second)["Training"] == ("True", "Training") and second.phase == "Running"
    assert second.step == 4 and second.rollouts.scored == 32 and second.pass_at1 == {"p": 0.5}
    assert second.start_time == T0 + timedelta(seconds=5)
    # lastTransitionTime moves only on a status change.
    ready_first = next(c for c in first.conditions if c.type == "Ready")
    ready_second = next(c for c in second.conditions if c.type == "Ready")
    assert ready_first.last_transition_time == ready_second.last_transition_time == T0
    events = transitions(first.conditions, second.conditions)
    assert [(e.type, e.reason) for e in events] == [("Normal", "Training")]


def test_trouble_reasons_from_pods() -> None:
    cases = {
        "ImagePullBackOff": {"containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "ErrImagePull"}}}]},
        "InsufficientGPU": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                            "message": "0/2 nodes: 2 Insufficient nvidia.com/gpu"}]},
        "Unschedulable": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                          "message": "node(s) had untolerated taint"}]},
        "CrashLoopBackOff": {"containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]},
        "ConfigError": {"initContainerStatuses": [{"name": "i", "state": {"waiting": {
            "reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}}}]},
    }
    for reason, pod_status in cases.items():
        observed = Observed(engine={"spec": {"replicas": 1}, "status": {}}, proxy=ready(), runners={"p": ready()},
                            pods=[pod("engine", pod_status)])
        status = run_status(SPEC, 1, None, observed, T0)
        assert conds(status)["EngineReady"] == ("False", reason)
        assert conds(status)["Ready"] == ("False", reason)
        assert [e.type for e in transitions([], status.conditions) if e.reason == reason] == ["Warning", "Warning"]


def test_learner_trouble_and_hub_export_failing() -> None:
    observed = Observed(engine=ready(), proxy=ready(), runners={"p": ready()}, learner={"status": {"active": 1}},
                        pods=[pod("learner", {"containerStatuses": [{"name": "learner", "state": {"waiting": {
                            "reason": "CrashLoopBackOff"}}}]})])
    assert conds(run_status(SPEC, 1, None, observed, T0))["Training"] == ("False", "CrashLoopBackOff")
    failing = observed.model_copy(update={"learner": {"status": {"ready": 1}}, "pods": [],
                                          "progress": learner_status(step=2, policy_version=2, export_error="401")})
    status = run_status(SPEC, 1, None, failing, T0)
    assert conds(status)["Training"] == ("True", "HubExportFailing")
    assert any(e.type == "Warning" and e.reason == "HubExportFailing" for e in transitions([], status.conditions))
    # The collapse alarm: a pool's held-out pass@1 well below its best is a warning on the Training condition.
    fallen = EvalRegression(pool="p", best_step=4, best_pass_at_1=0.75, step=8, pass_at_1=0.125)
    regressed = failing.model_copy(update={"progress": learner_status(step=8, policy_version=8, eval_regressions=[fallen])})
    status = run_status(SPEC, 1, None, regressed, T0)
    training = next(c for c in status.conditions if c.type == "Training")
    assert (training.status, training.reason) == ("True", "EvalRegressed")
    assert training.message.endswith("p held-out pass@1 fell from 0.75 (step 4) to 0.12 (step 8)")
    assert any(e.type == "Warning" and e.reason == "EvalRegressed" for e in transitions([], status.conditions))


def test_complete_and_failed_are_terminal() -> None:
    done = run_status(SPEC, 1, None, Observed(learner={"status": {"conditions": [{"type": "Complete", "status": "True"}]}}), T0)
    assert conds(done)["Complete"] == ("True", "TrainingComplete") and done.phase == "Succeeded"
    assert done.completion_time == T0
    # The Job vanishing later does not undo it.
    later = run_status(SPEC, 1, done, Observed(), T0 + timedelta(hours=1))
    assert conds(later)["Complete"] == ("True", "TrainingComplete") and later.completion_time == T0
    failed = run_status(SPEC, 1, None, Observed(learner={"status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "backoff"}]}}), T0)
    assert conds(failed)["Failed"] == ("True", "RestartBudgetExhausted") and failed.phase == "Failed"
    late = run_status(SPEC, 1, None, Observed(learner={"status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "Job was active longer than "
         "specified deadline"}]}}), T0)
    assert conds(late)["Failed"] == ("True", "DeadlineExceeded") and late.phase == "Failed"


def test_suspended() -> None:
    spec = SPEC.model_copy(update={"suspend": True})
    status = run_status(spec, 2, None, Observed(), T0)
    assert conds(status)["Suspended"] == ("True", "SuspendedByUser") and status.phase == "Suspended"
    resumed = run_status(SPEC, 3, status, Observed(), T0)
    assert [(e.reason, e.type) for e in transitions(status.conditions, resumed.conditions)
            if e.reason == "NotSuspended"] == [("NotSuspended", "Normal")]


def test_pool_status() -> None:
    deployments = [{"spec": {"replicas": 2}, "status": {"replicas": 2, "readyReplicas": 1}}]
    crash = pod("runner", {"containerStatuses": [{"name": "runner", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]})
    status = pool_status(1, None, "p", deployments, [crash], PoolRolloutCounts(completed=5), T0)
    assert status.phase == "Degraded" and status.replicas == 2 and status.ready_replicas == 1
    assert conds(status)["Ready"] == ("False", "CrashLoopBackOff") and status.rollouts.completed == 5
    assert status.selector == "harnessrl.io/component=runner,harnessrl.io/pool=p"
    assert pool_status(1, None, "p", [], [], PoolRolloutCounts(), T0).phase == "Pending"


def test_the_learners_eval_results_map_into_status() -> None:
    """What the learner serves (its own CoordinatorStatus model) read as the operator reads it: the latest
    round's pass@1 by pool, the round in progress in the Training message, the last step's reward, the
    checkpoint and the Hub branch; a later status without a new evaluation keeps the last pass@1."""
    from harnessrl.runtime.contracts.coordinator import CoordinatorStatus, EvalProgress, EvalRecord, PoolScore

    def score(pool: str, solved: int) -> PoolScore:
        return PoolScore(pool=pool, harness=pool, rollouts=4, scored=4, solved=solved, unscored=0, pending=0,
                         pass_at_1=solved / 4, mean_correctness=solved / 4)

    record = EvalRecord(step=4, policy_version=4, model="m-v4", time=0.0, tasks=4, attempts=1,
                        pools=[score("p", 1), score("eval-only", 3)])
    wire = CoordinatorStatus(step=5, policy_version=5, open_groups=2, ready_groups=0, leased=3, rollouts_scored=40,
                             rollouts_unscored=1, rollouts_stale=0, groups_skipped_zero_variance=0, policy_model="m-v5",
                             done=False, mean_reward=0.625, pass_at1=record.pass_at1(), last_eval=record,
                             evaluating=EvalProgress(step=5, policy_version=5, rollouts=8, finished=3),
                             latest_checkpoint="/ckpt/step-0000004", hub_revision="step-4")
    progress = CoordinatorStatus.model_validate(wire.model_dump(mode="json"))
    observed = Observed(engine=ready(), proxy=ready(), runners={"p": ready()}, learner={"status": {"active": 1, "ready": 1}},
                        progress=progress)
    status = run_status(SPEC, 1, None, observed, T0)
    assert status.pass_at1 == {"p": 0.25, "eval-only": 0.75}
    assert (status.mean_reward, status.latest_checkpoint, status.hub_revision) == (0.625, "/ckpt/step-0000004", "step-4")
    training = next(c for c in status.conditions if c.type == "Training")
    assert training.message == "step 5/10, policy v5, evaluating step 5 (3/8 rollouts)"
    later = CoordinatorStatus.model_validate(wire.model_copy(update={"step": 6, "policy_version": 6, "pass_at1": {}, "evaluating": None})
                                           .model_dump(mode="json"))
    status = run_status(SPEC, 1, status, observed.model_copy(update={"progress": later}), T0)
    assert status.step == 6 and status.pass_at1 == {"p": 0.25, "eval-only": 0.75}
    assert next(c for c in status.conditions if c.type == "Training").message == "step 6/10, policy v6"


def test_every_condition_and_reason_written_is_documented() -> None:
    """What the status code writes, across the states above, is listed (and so documented) in api/reasons.py,
    and Warning Events are exactly the reasons marked as trouble there."""
    from harnessrl.operator.api.reasons import CONDITION_TYPES, REASONS

    crash = pod("engine", {"containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]})
    learner = {"status": {"active": 1, "ready": 1}}
    states = [
        run_status(SPEC, 1, None, Observed(), T0),
        run_status(SPEC, 1, None, Observed(engine={"spec": {"replicas": 1}}, proxy=ready(), runners={"p": ready()},
                                           pods=[crash]), T0),
        run_status(SPEC, 1, None, Observed(engine=ready(), proxy=ready(), runners={"p": ready()}, learner=learner,
                                           progress=learner_status(step=1, policy_version=1, export_error="x")), T0),
        run_status(SPEC.model_copy(update={"suspend": True}), 1, None, Observed(), T0),
        run_status(SPEC, 2, None, Observed(deferred=["Job x-learner keeps its Pods' nodeSelector while it runs"]), T0),
        run_status(SPEC, 1, None, Observed(learner={"status": {"conditions": [{"type": "Complete", "status": "True"}]}}), T0),
        run_status(SPEC, 1, None, Observed(learner={"status": {"conditions": [{"type": "Failed", "status": "True"}]}}), T0),
        failed_with_reason_state(),
        blocked_status(1, None, "InvalidSpec", "bad"),
        blocked_status(1, None, "LearnerMemoryTooSmall", "too big"),
        pool_status(1, None, "p", [], [], PoolRolloutCounts(), T0),
        pool_status(1, None, "p", [ready()], [], PoolRolloutCounts(), T0),
    ]
    written = [c for s in states for c in s.conditions]
    assert {c.type for c in written} <= set(CONDITION_TYPES)
    assert {c.reason for c in written} <= set(REASONS)
    for s in states:
        for event in transitions([], s.conditions):
            assert (event.type == "Warning") == REASONS[event.reason].warning, event


def test_spec_applied_says_what_waits_for_the_learners_next_start_and_a_finished_run_keeps_its_last_word() -> None:
    waits = "Job x-learner keeps its Pods' nodeSelector while it runs: the new placement applies when it next starts"
    first = run_status(SPEC, 1, None, Observed(), T0)
    assert conds(first)["SpecApplied"] == ("True", "SpecInEffect")
    edited = run_status(SPEC, 2, first, Observed(deferred=[waits]), T0)
    applied = next(c for c in edited.conditions if c.type == "SpecApplied")
    assert (applied.status, applied.reason, applied.message) == ("False", "AppliesAtNextStart", waits)
    assert applied.observed_generation == 2 and edited.observed_generation == 2
    assert [(e.type, e.reason) for e in transitions(first.conditions, edited.conditions)] == [("Normal", "AppliesAtNextStart")]
    restarted = run_status(SPEC, 2, edited, Observed(), T0)
    assert conds(restarted)["SpecApplied"] == ("True", "SpecInEffect")
    complete = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    finished = run_status(SPEC, 3, edited, Observed(learner=complete), T0)
    assert conds(finished)["SpecApplied"] == ("False", "AppliesAtNextStart")


def failed_with_reason_state() -> TrainingRunStatus:
    # The Job's podFailurePolicy failed it at the learner's EXIT_FAILED; the reason is in the termination log.
    learner_pod = pod("learner", {"containerStatuses": [{"name": "learner", "state": {"terminated": {
        "exitCode": 78, "message": "WeightSyncUnsupported: POST http://e/pause -> 404: no weight-transfer API"}}}]})
    job = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
                                      "message": "Container learner failed with exit code 78"}]}}
    return run_status(SPEC, 1, None, Observed(learner=job, pods=[learner_pod]), T0)


def test_a_learner_that_failed_with_a_reason_fails_the_run_with_it() -> None:
    failed = failed_with_reason_state()
    assert conds(failed)["Failed"] == ("True", "WeightSyncUnsupported") and failed.phase == "Failed"
    assert "no weight-transfer API" in next(c.message for c in failed.conditions if c.type == "Failed")


def gpu_pod(component: str, gpus: int, started: datetime, phase: str = "Running", name: str = "x-0") -> dict[str, Any]:
    return pod(component, {"phase": phase, "startTime": started.strftime("%Y-%m-%dT%H:%M:%SZ")}, name) | {
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def test_usage_counts_gpu_seconds_of_running_pods_once_a_minute_and_the_learners_counters() -> None:
    pods = [gpu_pod("engine", 2, T0, name="e-0"), gpu_pod("engine", 2, T0 + timedelta(seconds=60), name="e-1"),
            gpu_pod("learner", 4, T0), gpu_pod("proxy", 0, T0, name="p-0"),
            gpu_pod("engine", 2, T0, phase="Pending", name="e-2")]
    progress = learner_status(step=1, policy_version=1, tokens_trained=5000, pools={
        "p": {"completed": 6, "failed": 1, "timed_out": 1, "sampled_tokens": 1200, "sandbox_seconds": 240.0},
        "q": {"completed": 2, "sandbox_seconds": 60.0}})
    first = run_status(SPEC, 1, None, Observed(pods=pods, progress=progress), now=T0 + timedelta(seconds=120))
    usage = first.usage
    # engines: 2 GPUs x 120 s + 2 GPUs x 60 s; the learner: 4 x 120 s; the proxy and a Pending Pod hold none.
    assert usage.gpu_seconds == {"engine": 360.0, "learner": 480.0}
    assert (usage.rollouts, usage.sandbox_seconds, usage.tokens_sampled, usage.tokens_trained) == (10, 300.0, 1200, 5000)
    # 30 s later: not yet a minute since the last count, so nothing moves (no status write for it).
    assert run_status(SPEC, 1, first, Observed(pods=pods), now=T0 + timedelta(seconds=150)).usage == usage
    # 90 s later: counted from the last count on, not from the Pods' start. The learner's counters never go down
    # (a learner resumed from an older checkpoint reports less).
    later = run_status(SPEC, 1, first, Observed(pods=pods, progress=learner_status(step=1, policy_version=1)),
                       now=T0 + timedelta(seconds=210)).usage
    assert later.gpu_seconds == {"engine": 360.0 + 2 * 2 * 90, "learner": 480.0 + 4 * 90}
    assert (later.rollouts, later.tokens_trained) == (10, 5000)
    # No GPU Pod running: the count stays, and so does its time (a suspended run writes nothing).
    idle = run_status(SPEC, 1, first, Observed(pods=[]), now=T0 + timedelta(hours=1)).usage
    assert idle == usage


def test_an_engine_pools_usage_counts_its_servers_gpu_seconds_once_a_minute() -> None:
    servers = [gpu_pod("enginepool", 2, T0, name="s-0"), gpu_pod("enginepool", 2, T0 + timedelta(seconds=60), name="s-1"),
               gpu_pod("enginepool", 2, T0, phase="Pending", name="s-2")]
    first = engine_pool_status(1, None, ready(2), servers, ["run-a"], now=T0 + timedelta(seconds=120))
    assert first.usage.gpu_seconds == 2 * 120 + 2 * 60  # a Pending server holds none
    assert engine_pool_status(1, first, ready(2), servers, [], now=T0 + timedelta(seconds=150)).usage == first.usage
    later = engine_pool_status(1, first, ready(2), servers, [], now=T0 + timedelta(seconds=210)).usage
    assert later.gpu_seconds == first.usage.gpu_seconds + 2 * 2 * 90
    assert engine_pool_status(1, first, ready(0), [], [], now=T0 + timedelta(hours=1)).usage == first.usage
