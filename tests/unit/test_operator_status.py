"""Children's state -> conditions, phase, progress and Events (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from harnessrl.operator.api.harnesspool import PoolRolloutCounts
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.handlers.progress import LearnerProgress
from harnessrl.operator.handlers.status import Observed, pool_status, run_status, transitions

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
    return {"metadata": {"name": name, "labels": {"app.kubernetes.io/component": component}}, "status": status}


def conds(status: Any) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_pending_then_training_with_progress() -> None:
    first = run_status(SPEC, 1, None, Observed(engine=ready(), proxy=ready(), runners={"p": ready()}), T0)
    assert conds(first)["Ready"] == ("True", "AllComponentsReady")
    assert conds(first)["Training"] == ("False", "WaitingForLearner") and first.phase == "Pending"
    progress = LearnerProgress(step=4, policy_version=4, rollouts_scored=32, mean_reward=0.4, pass_at1={"p": 0.5})
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
                                          "progress": LearnerProgress(step=2, policy_version=2, export_error="401")})
    status = run_status(SPEC, 1, None, failing, T0)
    assert conds(status)["Training"] == ("True", "HubExportFailing")
    assert any(e.type == "Warning" and e.reason == "HubExportFailing" for e in transitions([], status.conditions))


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
    assert status.selector == "app.kubernetes.io/component=runner,harnessrl.io/pool=p"
    assert pool_status(1, None, "p", [], [], PoolRolloutCounts(), T0).phase == "Pending"
