"""Evaluation rounds inside training: when a round opens, how its leases go out (first, marked, per pool), where
its completions go (the eval ledger, not GRPO groups), what it records, and how it survives a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from harnessrl.runtime.contracts.coordinator import AckStatus, Completion, LeaseRequest, PoolHarness
from harnessrl.runtime.contracts.learner_config import (
    EvalSchedule,
    GrpoConfig,
    HarnessWeight,
    RewardConfig,
    TaskSource,
)
from harnessrl.runtime.learner.coordinator import (
    Coordinator,
    CoordinatorError,
    CoordinatorState,
    UnknownRollout,
)
from harnessrl.runtime.learner.evaluation import EvalLog, is_eval_rollout, read_records
from harnessrl.runtime.learner.schedule import GroupPlanner
from harnessrl.runtime.trajectory.models import TrainingSequence
from prometheus_client import CollectorRegistry, generate_latest

TRAINED = [HarnessWeight(pool="pa", harness="mini", weight=1)]
# "pa" is trained on and evaluated; "pe" is evaluated only. No base round: these tests count the later ones.
SCHEDULE = EvalSchedule(every_steps=2, pools=[PoolHarness(pool="pa", harness="mini"), PoolHarness(pool="pe", harness="qwen")],
                        tasks=TaskSource(ids=["x"]), attempts=1, at_start=False)
PA = LeaseRequest(runner_id="ra", pool="pa", harness="mini", max=100)
PE = LeaseRequest(runner_id="re", pool="pe", harness="qwen", max=100)


def make(steps: int = 3, state: CoordinatorState | None = None, schedule: EvalSchedule | None = SCHEDULE) -> Coordinator:
    grpo = GrpoConfig(group_size=2, groups_per_step=1, max_open_groups=1, steps=steps)
    planner = GroupPlanner(["t0", "t1"], TRAINED, seed=0, shuffle=False)
    return Coordinator(planner, grpo, RewardConfig(), 10.0, "tiny", "http://proxy", state=state,
                       evaluation=schedule, eval_task_ids=["e0", "e1"] if schedule else None)


def finish(**kw: object) -> Completion:
    return Completion.model_validate({"session_id": "s", "outcome": "solved", **kw})


def step(c: Coordinator) -> None:
    c.finish_step(c.state.policy_version + 1, f"tiny-v{c.state.policy_version + 1}", done=c.state.step + 1 >= c.grpo.steps)


def steps(c: Coordinator, n: int) -> None:
    for _ in range(n):
        step(c)


def test_rounds_open_every_n_steps_and_after_the_last_one() -> None:
    c = make(steps=3)
    step(c)
    assert c.state.eval_round is None and c.status().evaluating is None
    step(c)  # step 2: every_steps
    r = c.state.eval_round
    assert r is not None and (r.step, r.policy_version, r.model) == (2, 2, "tiny-v2")
    assert c.close_eval(now=0) is None  # nothing done yet: training waits
    # 2 tasks x 2 pools x 1 attempt
    assert c.status().evaluating is not None and c.status().evaluating.rollouts == 4
    for lease in c.lease(PA, now=0)[:2] + c.lease(PE, now=0):
        c.complete(finish(rollout_id=lease.rollout_id, lease_id=lease.lease_id), [])
    assert c.close_eval(now=1) is not None and c.state.eval_round is None
    step(c)  # step 3: the last step, not a multiple of 2, still evaluated; the run is done only after it
    assert c.state.eval_round is not None and c.state.eval_round.step == 3 and not c.state.done
    assert not c.status().done
    for lease in [le for le in c.lease(PA, now=2) if is_eval_rollout(le.rollout_id)] + c.lease(PE, now=2):
        c.complete(finish(rollout_id=lease.rollout_id, lease_id=lease.lease_id, outcome="wrong"), [])
    rec = c.close_eval(now=3)
    assert rec is not None and rec.step == 3 and c.state.done
    assert c.status().pass_at1 == {"pa": 0.0, "pe": 0.0} and c.status().last_eval == rec


def test_the_base_policy_is_evaluated_before_the_first_step_and_not_again_on_resume() -> None:
    c = make(schedule=SCHEDULE.model_copy(update={"at_start": True}))
    r = c.state.eval_round
    assert r is not None and (r.step, r.policy_version, r.model) == (0, 0, "tiny")
    evals = [le for le in c.lease(PA, now=0) + c.lease(PE, now=0) if is_eval_rollout(le.rollout_id)]
    assert len(evals) == 4 and all(le.policy_version == 0 and not le.training for le in evals)
    for lease, outcome in zip(evals, ["solved", "wrong", "wrong", "wrong"], strict=True):
        c.complete(finish(rollout_id=lease.rollout_id, lease_id=lease.lease_id, outcome=outcome), [])
    rec = c.close_eval(now=1)
    assert rec is not None and rec.step == 0 and rec.pass_at1() == {"pa": 0.5, "pe": 0.0} and not c.state.done
    # A learner resumed from a checkpoint has its state: no second base round.
    assert make(state=c.state.model_copy(deep=True), schedule=SCHEDULE.model_copy(update={"at_start": True})
                ).state.eval_round is None


def test_eval_leases_come_first_marked_not_for_training_and_only_to_eval_pools() -> None:
    c = make()
    steps(c, 2)
    leases = c.lease(PA, now=0)
    evals = [le for le in leases if is_eval_rollout(le.rollout_id)]
    train = [le for le in leases if not is_eval_rollout(le.rollout_id)]
    assert leases[: len(evals)] == evals and len(evals) == 2 and len(train) == 2  # then the open group's slots
    assert all(not le.training and le.policy_version == 2 and le.model == "tiny-v2" for le in evals)
    assert all(le.training for le in train)
    assert {le.task_id for le in evals} == {"e0", "e1"} and {le.pool for le in evals} == {"pa"}
    # The eval-only pool gets its eval rollouts and no training ones; a wrong harness is refused.
    assert {(le.pool, le.harness, le.training) for le in c.lease(PE, now=0)} == {("pe", "qwen", False)}
    with pytest.raises(CoordinatorError, match="runs harness 'qwen'"):
        c.lease(PE.model_copy(update={"harness": "mini"}), now=0)
    # No round open: an eval-only pool simply has nothing to do.
    c2 = make()
    assert c2.lease(PE, now=0) == []


def test_eval_completions_go_to_the_ledger_not_to_groups() -> None:
    c = make()
    steps(c, 2)
    [e0, e1, *_] = c.lease(PA, now=0)
    seq_before, scored_before = c.state.journal_seq, c.state.counters.rollouts_scored
    ack = c.complete(finish(rollout_id=e0.rollout_id, lease_id=e0.lease_id, tool_calls=3), [])
    assert ack.status == AckStatus.accepted and ack.scored and ack.reward == 1.0
    assert c.state.journal_seq == seq_before + 1  # journaled and replayed like any completion
    assert c.state.counters.rollouts_scored == scored_before  # ... but not a training rollout
    assert c.ready_groups() == 0 and c.harness_of(e0.rollout_id) == "mini"
    # Idempotent: the same lease again, or a late second lease's completion, is a duplicate.
    again = c.check(finish(rollout_id=e0.rollout_id, lease_id=e0.lease_id))
    assert again is not None and again.status == AckStatus.duplicate
    assert c.complete(finish(rollout_id=e0.rollout_id, lease_id=e0.lease_id), []).status == AckStatus.duplicate
    # An infra failure gives the rollout back to be leased again.
    ack = c.complete(finish(rollout_id=e1.rollout_id, lease_id=e1.lease_id, outcome="infra_error"), [])
    assert ack.status == AckStatus.accepted and not ack.scored
    assert [le.rollout_id for le in c.lease(PA, now=1) if is_eval_rollout(le.rollout_id)] == [e1.rollout_id]
    # A rollout id of the round that it does not have is unknown; one of a closed round is a duplicate.
    with pytest.raises(UnknownRollout):
        c.check(finish(rollout_id=c.state.eval_round.prefix + "pa/nope/a0", lease_id="l"))
    old = finish(rollout_id="eval-s1-000000/pa/e0/a0", lease_id="l")
    assert c.complete(old, []).status == AckStatus.duplicate


def test_pass_at_1_counts_solved_among_scored_and_leaves_out_unscored() -> None:
    c = make(steps=2)
    steps(c, 2)
    outcomes = {"pa/e0": "solved", "pa/e1": "wrong", "pe/e0": "solved", "pe/e1": "grader_error"}
    for now in range(3):  # grader_error three times: left out for good
        for le in c.lease(PA, now=now) + c.lease(PE, now=now):
            if is_eval_rollout(le.rollout_id):
                outcome = outcomes[f"{le.pool}/{le.task_id}"]
                c.complete(finish(rollout_id=le.rollout_id, lease_id=le.lease_id, outcome=outcome), [])
    rec = c.close_eval(now=5)
    assert rec is not None and (rec.tasks, rec.attempts) == (2, 1)
    by_pool = {p.pool: p for p in rec.pools}
    assert rec.pass_at1() == {"pa": 0.5, "pe": 1.0}
    assert (by_pool["pe"].scored, by_pool["pe"].unscored, by_pool["pe"].solved) == (1, 1, 1)


def test_a_runner_that_vanished_cannot_hold_the_round_forever() -> None:
    c = make(steps=2)
    steps(c, 2)
    c.lease(PA, now=0), c.lease(PE, now=0)
    # Leases expire after 10 s; each expiry counts against max_unscored (3), then the rollout is left out.
    assert c.close_eval(now=11) is None and c.close_eval(now=11) is None
    for now in (11, 22):
        c.lease(PA, now=now), c.lease(PE, now=now)
    rec = c.close_eval(now=40)
    assert rec is not None and all(p.unscored == p.rollouts == 2 and p.pass_at_1 is None for p in rec.pools)
    assert rec.pass_at1() == {} and c.state.done


def test_a_live_runner_renews_its_eval_leases_past_the_ttl() -> None:
    c = make(steps=2)
    steps(c, 2)
    held = c.lease(PE, now=0)
    assert len(held) == 2 and all(not x.training for x in held)
    for now in (8, 16, 24):
        assert c.renew([x.lease_id for x in held], now=now) == [x.lease_id for x in held]
    assert c.close_eval(now=30) is None and c.lease(PE, now=30) == []  # renewed until 34: nothing expired


def test_an_open_round_survives_a_checkpoint_and_a_lost_round_reopens_fresh() -> None:
    c = make(steps=2)
    steps(c, 2)
    [le, le2] = c.lease(PE, now=0)
    snapshot = CoordinatorState.model_validate_json(c.state.model_dump_json())
    # Completions accepted after the checkpoint are replayed from the journal into the restored round, once.
    c.complete(finish(rollout_id=le2.rollout_id, lease_id=le2.lease_id, outcome="wrong"), [])
    restored = make(steps=2, state=snapshot)
    replayed = finish(rollout_id=le2.rollout_id, lease_id=le2.lease_id, outcome="wrong")
    assert restored.complete(replayed, []).status == AckStatus.accepted
    assert restored.state.journal_seq == c.state.journal_seq
    assert restored.complete(replayed, []).status == AckStatus.duplicate
    # A completion of a lease handed out before the restart still counts in the restored round.
    assert restored.complete(finish(rollout_id=le.rollout_id, lease_id=le.lease_id), []).status == AckStatus.accepted
    assert restored.status().evaluating.finished == 2  # type: ignore[union-attr]
    # A round opened again for the same step (its checkpoint was lost) gets new rollout ids.
    again = make(steps=2)
    steps(again, 2)
    assert again.state.eval_round is not None and again.state.eval_round.prefix != c.state.eval_round.prefix
    assert again.complete(finish(rollout_id=le.rollout_id, lease_id=le.lease_id), []).status == AckStatus.duplicate


def test_without_a_schedule_nothing_is_evaluated_and_the_config_needs_eval_tasks() -> None:
    c = make(steps=2, schedule=None)
    steps(c, 2)
    assert c.state.eval_round is None and c.state.done and c.status().pass_at1 == {}
    with pytest.raises(CoordinatorError, match="at least one task id"):
        Coordinator(GroupPlanner(["t"], TRAINED, 0, False), GrpoConfig(), RewardConfig(), 1.0, "m", "http://p",
                    evaluation=SCHEDULE, eval_task_ids=[])
    limited = SCHEDULE.model_copy(update={"tasks": TaskSource(ids=["c", "a", "b"]), "limit": 2})
    assert limited.task_ids() == ["a", "b"]


def test_eval_log_replaces_a_replayed_round_and_truncates_on_resume(tmp_path: Path) -> None:
    c = make(steps=4)
    registry = CollectorRegistry()
    log = EvalLog(tmp_path / "eval.jsonl", registry)
    for _ in range(2):
        steps(c, 2)
        for le in [x for x in c.lease(PA, now=0) if is_eval_rollout(x.rollout_id)] + c.lease(PE, now=0):
            c.complete(finish(rollout_id=le.rollout_id, lease_id=le.lease_id), [])
        rec = c.close_eval(now=1)
        assert rec is not None
        log.record(rec)
    assert log.record(rec) == []  # the round at step 4 replayed after a restart; no pool fell
    assert [r.step for r in read_records(log.path)] == [2, 4]
    assert 'harnessrl_learner_eval_pass_at_1{pool="pe"} 1.0' in generate_latest(registry).decode()
    # A later round where every attempt failed: the collapse alarm names each pool, and the status carries it.
    fallen = rec.model_copy(update={"step": 6, "pools": [
        p.model_copy(update={"solved": 0, "pass_at_1": 0.0}) for p in rec.pools]})
    c.state.eval_regressions = log.record(fallen)
    assert [(p.pool, p.solved, p.scored) for p in rec.pools] == [("pa", 2, 2), ("pe", 2, 2)]
    # 0/2 tops at 0.66 at 95%, under the best round's 1.0 (2/2, at step 2: the earliest of the equal ones).
    assert [(r.pool, r.best_step, r.best_pass_at_1, r.step, r.pass_at_1) for r in c.status().eval_regressions] == [
        ("pa", 2, 1.0, 6, 0.0), ("pe", 2, 1.0, 6, 0.0)]
    log.truncate_to(3)  # resumed from the checkpoint of step 3: steps 4 and 6 are evaluated again
    assert [r.step for r in read_records(log.path)] == [2]


def test_status_counts_rollouts_by_pool_for_the_harness_pool_status() -> None:
    c = make(steps=2)
    steps(c, 2)
    leases = c.lease(PA, now=0)  # 2 eval + 2 training, all active
    [pe0, pe1] = c.lease(PE, now=0)
    for lease, outcome in zip([*leases, pe0, pe1], ["solved", "timeout", "wrong", "infra_error", "harness_error"],
                              strict=False):
        # Every rollout called one tool its harness did not offer; the training one that went wrong, two more
        # with arguments the schema refused.
        # Each one also retried a call; the one that went wrong, resent a reply changed twice.
        invalid = 2 if outcome == "wrong" else 0
        # It captured two sequences, of 2 and 1 sampled tokens (a scored training rollout: counted as captured).
        breaks = {"retry": 1} | ({"reply_changed": 2} if outcome == "wrong" else {})
        sequences = [TrainingSequence(session_id="s", node_ids=[0], token_ids=[1, 2, 3], loss_mask=mask,
                                      logprobs=[0.0, -0.1, -0.1], policy_versions=[0, 0, 0])
                     for mask in ([0, 1, 1], [0, 0, 1])] if outcome == "wrong" else []
        # Each ran 30 s from start to grade but the infra error, which reported no timings.
        timings = None if outcome == "infra_error" else {"started_at": 1000.0, "finished_at": 1030.0}
        c.complete(finish(rollout_id=lease.rollout_id, lease_id=lease.lease_id, outcome=outcome,
                          tool_calls=3, unknown_tool_calls=1, invalid_tool_calls=invalid, prefix_breaks=breaks,
                          timings=timings),
                   sequences)
    pools = c.status().pools
    # pa: eval solved + timeout, training wrong + infra_error; pe: one harness_error, one still leased.
    assert pools["pa"].model_dump() == {"active": 0, "completed": 2, "failed": 1, "timed_out": 1, "grader_failures": 0,
                                        "unknown_tool_calls": 4, "invalid_tool_calls": 2,
                                        "prefix_breaks": {"retry": 4, "reply_changed": 2},
                                        "captured_rollouts": 1, "sequences": 2, "sampled_tokens": 3,
                                        "sandbox_seconds": 90.0}
    assert pools["pe"].model_dump() == {"active": 1, "completed": 0, "failed": 1, "timed_out": 0, "grader_failures": 0,
                                        "unknown_tool_calls": 1, "invalid_tool_calls": 0,
                                        "prefix_breaks": {"retry": 1},
                                        "captured_rollouts": 0, "sequences": 0, "sampled_tokens": 0,
                                        "sandbox_seconds": 30.0}
