"""Coordinator state machine: leases, expiry, idempotent completion, unscored retries, staleness, rotation."""

from __future__ import annotations

import pytest
from harnessrl.runtime.contracts.coordinator import AckStatus, Completion, LeaseRequest, OutcomeKind
from harnessrl.runtime.contracts.learner_config import GrpoConfig, HarnessWeight, RewardConfig
from harnessrl.runtime.learner.coordinator import (
    Coordinator,
    CoordinatorError,
    CoordinatorState,
    SlotStatus,
    UnknownRollout,
)
from harnessrl.runtime.learner.schedule import GroupPlanner
from harnessrl.runtime.trajectory.models import TrainingSequence

HS = [HarnessWeight(pool="pa", harness="mini", weight=2), HarnessWeight(pool="pb", harness="codex", weight=1)]


def make(group_size: int = 4, groups_per_step: int = 1, max_staleness: int = 1, ttl: float = 10.0,
         state: CoordinatorState | None = None) -> Coordinator:
    grpo = GrpoConfig(group_size=group_size, groups_per_step=groups_per_step, max_staleness=max_staleness,
                      max_open_groups=3)
    planner = GroupPlanner(["t0", "t1", "t2"], HS, seed=0, shuffle=False)
    return Coordinator(planner, grpo, RewardConfig(), ttl, "tiny", "http://proxy", max_attempts=2, state=state)


def seq(version: int, session: str = "s") -> TrainingSequence:
    return TrainingSequence(session_id=session, node_ids=[0], token_ids=[1, 2, 3], loss_mask=[0, 1, 1],
                            logprobs=[0.0, -0.5, -0.7], policy_versions=[version] * 3)


def done(lease_rollout: str, lease_id: str, outcome: OutcomeKind = OutcomeKind.solved,
         correctness: float = 1.0) -> Completion:
    return Completion(rollout_id=lease_rollout, lease_id=lease_id, session_id="s", outcome=outcome,
                      correctness=correctness, tool_calls=2)


def test_groups_follow_rotation_and_window() -> None:
    c = make()
    leases = c.lease(LeaseRequest(runner_id="r", pool="pa", harness="mini", max=100), now=0)
    # Window of 3 groups planned a, b, a: pool pa gets the 8 slots of groups 0 and 2.
    assert sorted({le.group_id for le in leases}) == ["g0000000", "g0000002"]
    assert len(leases) == 8
    assert {le.harness for le in leases} == {"mini"}
    assert all(le.model == "tiny" and le.proxy_url == "http://proxy" and le.lease_deadline == 10 for le in leases)
    assert c.lease(LeaseRequest(runner_id="r", pool="pa", harness="mini", max=5), now=1) == []
    b = c.lease(LeaseRequest(runner_id="r2", pool="pb", harness="codex", max=2), now=1)
    assert [le.rollout_id for le in b] == ["g0000001-r000", "g0000001-r001"]


def test_pool_harness_mismatch_is_refused() -> None:
    c = make()
    with pytest.raises(CoordinatorError, match="runs harness 'mini'"):
        c.lease(LeaseRequest(runner_id="r", pool="pa", harness="codex"), now=0)


def test_expired_lease_is_released_once_and_first_completion_wins() -> None:
    c = make(ttl=10)
    [first] = c.lease(LeaseRequest(runner_id="slow", pool="pb", harness="codex"), now=0)
    [again] = c.lease(LeaseRequest(runner_id="fast", pool="pb", harness="codex"), now=11)
    assert again.rollout_id == first.rollout_id and again.lease_id != first.lease_id
    assert c.state.counters.leases_expired == 1
    ack = c.complete(done(again.rollout_id, again.lease_id), [seq(0)])
    assert ack.status == AckStatus.accepted and ack.scored and ack.reward == pytest.approx(1.0 + 0.1 * 15 / 17)
    late = c.complete(done(first.rollout_id, first.lease_id, OutcomeKind.wrong, 0.0), [seq(0)])
    assert late.status == AckStatus.duplicate and late.reward == ack.reward
    repeat = c.complete(done(again.rollout_id, again.lease_id), [seq(0)])
    assert repeat.status == AckStatus.duplicate
    assert c.state.counters.rollouts_scored == 1 and c.state.counters.duplicates == 2


def test_renewed_lease_outlives_its_ttl_and_a_finished_one_is_not_renewed() -> None:
    c = make(ttl=10)
    req = LeaseRequest(runner_id="slow", pool="pb", harness="codex", max=2)
    a, b = c.lease(req, now=0)
    assert c.renew([a.lease_id, b.lease_id, "g0000009-r000.a1"], now=8) == [a.lease_id, b.lease_id]
    c.complete(done(b.rollout_id, b.lease_id), [seq(0)])
    assert c.renew([a.lease_id, b.lease_id], now=16) == [a.lease_id]
    # Still held at 25 (renewed until 26); gone once the renewals stop.
    assert [x.rollout_id for x in c.lease(LeaseRequest(runner_id="r2", pool="pb", harness="codex", max=8), now=25)] \
        == [f"g0000001-r00{i}" for i in (2, 3)]
    [again] = c.lease(LeaseRequest(runner_id="r2", pool="pb", harness="codex"), now=27)
    assert again.rollout_id == a.rollout_id and c.state.counters.leases_expired == 1


def test_release_hands_back_only_that_runners_leases_of_that_pool() -> None:
    c = make(ttl=10)
    mine = c.lease(LeaseRequest(runner_id="runner-0", pool="pa", harness="mini", max=3), now=0)
    other = c.lease(LeaseRequest(runner_id="runner-1", pool="pa", harness="mini", max=1), now=0)
    same_id_other_pool = c.lease(LeaseRequest(runner_id="runner-0", pool="pb", harness="codex", max=1), now=0)
    assert c.release("runner-0", "pa") == 3
    again = c.lease(LeaseRequest(runner_id="runner-0", pool="pa", harness="mini", max=3), now=1)
    assert [x.rollout_id for x in again] == [x.rollout_id for x in mine]
    assert c.state.counters.leases_expired == 3
    assert c.renew([x.lease_id for x in other + same_id_other_pool], now=1) == [
        x.lease_id for x in other + same_id_other_pool]


def test_a_step_trains_on_fewer_groups_once_it_has_consumed_its_limit() -> None:
    """Dynamic sampling is bounded: a policy that solves nearly everything must not stall each step."""
    grpo = GrpoConfig(group_size=2, groups_per_step=2, max_open_groups=3, max_groups_per_step=3)
    planner = GroupPlanner(["t0"], [HarnessWeight(pool="pa", harness="mini")], seed=0, shuffle=False)
    c = Coordinator(planner, grpo, RewardConfig(), 10.0, "tiny", "http://proxy")
    leases = c.lease(LeaseRequest(runner_id="r", pool="pa", harness="mini", max=6), now=0)
    solved = {"g0000000": (1.0, 1.0), "g0000001": (1.0, 0.0), "g0000002": (1.0, 1.0)}  # only g1 has variance

    def finish(group: str) -> None:
        for lease, correct in zip([x for x in leases if x.group_id == group], solved[group], strict=True):
            outcome = OutcomeKind.solved if correct else OutcomeKind.wrong
            c.complete(done(lease.rollout_id, lease.lease_id, outcome, correct), [seq(0)])

    finish("g0000000")
    finish("g0000001")
    assert c.take_batch(2) is None  # 1 skipped + 1 trainable: under the limit of 3, keep waiting for another
    finish("g0000002")
    batch = c.take_batch(2)
    assert batch is not None and [g.group_id for g in batch.groups] == ["g0000001"]
    assert batch.skipped == batch.zero_variance == 2 and c.state.carry.skipped == 0
    assert grpo.groups_per_step_limit() == 3 and GrpoConfig(groups_per_step=4).groups_per_step_limit() == 12
    # A policy that solves everything: three groups without variance make a step with nothing to train on.
    more = c.lease(LeaseRequest(runner_id="r", pool="pa", harness="mini", max=6), now=1)
    assert len({x.group_id for x in more}) == 3
    for lease in more[:4]:
        c.complete(done(lease.rollout_id, lease.lease_id), [seq(0)])
    assert c.take_batch(2) is None  # two skipped: under the limit
    for lease in more[4:]:
        c.complete(done(lease.rollout_id, lease.lease_id), [seq(0)])
    empty = c.take_batch(2)
    assert empty is not None and empty.groups == [] and empty.skipped == 3 and len(empty.rewards_by_harness["mini"]) == 6


def test_unscored_is_retried_then_abandoned() -> None:
    c = make()
    req = LeaseRequest(runner_id="r", pool="pb", harness="codex")
    [a1] = c.lease(req, now=0)
    ack = c.complete(done(a1.rollout_id, a1.lease_id, OutcomeKind.infra_error), [])
    assert ack.status == AckStatus.accepted and not ack.scored and ack.reward is None
    [a2] = c.lease(req, now=1)
    assert a2.rollout_id == a1.rollout_id  # handed out again, not scored 0
    c.complete(done(a2.rollout_id, a2.lease_id, OutcomeKind.grader_error), [])
    slot = c.state.groups[1].slots[0]
    assert slot.status == SlotStatus.abandoned
    assert c.state.counters.rollouts_unscored == 2 and c.state.counters.rollouts_scored == 0


def test_unknown_rollouts_and_foreign_leases_rejected() -> None:
    c = make()
    with pytest.raises(UnknownRollout):
        c.complete(done("nonsense", "x"), [])
    with pytest.raises(UnknownRollout):
        c.complete(done("g0000000-r009", "g0000000-r009.a1"), [])
    with pytest.raises(CoordinatorError, match="not a lease"):
        c.complete(done("g0000000-r000", "g0000000-r001.a1"), [])


def _fill(c: Coordinator, pool: str, harness: str, rewards: list[float], version: int = 0) -> str:
    leases = c.lease(LeaseRequest(runner_id="r", pool=pool, harness=harness, max=len(rewards)), now=0)
    for le, r in zip(leases, rewards, strict=True):
        outcome = OutcomeKind.solved if r == 1 else OutcomeKind.wrong
        c.complete(done(le.rollout_id, le.lease_id, outcome, r), [seq(version, le.rollout_id)])
    return leases[0].group_id


def test_batch_advantages_zero_variance_and_staleness() -> None:
    c = make(groups_per_step=1, max_staleness=1)
    g0 = _fill(c, "pa", "mini", [0, 0, 0, 0])  # zero variance: skipped
    assert c.take_batch(1) is None  # only a skippable group is final
    g1 = _fill(c, "pb", "codex", [1, 0, 0, 1])
    batch = c.take_batch(1)
    assert batch is not None
    assert [g.group_id for g in batch.groups] == [g1] and g0 != g1
    advs = [r.advantage for r in batch.groups[0].rollouts]
    assert advs[0] > 0 > advs[1] and sum(advs) == pytest.approx(0)
    assert all(r.sequences[0].session_id == r.rollout_id for r in batch.groups[0].rollouts)
    assert batch.zero_variance == 1 and c.state.counters.groups_zero_variance == 1
    assert batch.rewards_by_harness["mini"] == [0, 0, 0, 0]
    assert c.state.counters.groups_trained == 1
    # Two policy versions later, rollouts sampled at version 0 are stale (max_staleness 1).
    c.finish_step(2, "tiny-v2", done=False)
    _fill(c, "pa", "mini", [1, 0, 1, 0], version=0)
    assert c.take_batch(1) is None
    assert c.status().ready_groups == 0  # the all-stale group was consumed at once
    _fill(c, "pb", "codex", [1, 0, 1, 1], version=1)
    batch = c.take_batch(1)
    assert batch is not None and batch.stale == 4 and len(batch.groups) == 1
    assert c.lease(LeaseRequest(runner_id="r", pool="pa", harness="mini"), now=0)[0].model == "tiny-v2"
    assert c.state.counters.rollouts_stale == 4 and c.state.counters.groups_too_small == 1


def test_state_round_trips_and_replans_groups_after_a_crash() -> None:
    c = make()
    [le] = c.lease(LeaseRequest(runner_id="r", pool="pb", harness="codex"), now=0)
    saved = CoordinatorState.model_validate_json(c.state.model_dump_json())
    assert saved == c.state
    # A crashed run planned groups this state never saw; their completions still land, exactly once.
    fresh = make(state=CoordinatorState.model_validate_json(saved.model_dump_json()))
    ack = fresh.complete(done("g0000007-r002", "g0000007-r002.a1"), [seq(0)])
    assert ack.status == AckStatus.accepted
    assert fresh.state.next_group == 8
    assert fresh.complete(done("g0000007-r002", "g0000007-r002.a1"), [seq(0)]).status == AckStatus.duplicate
    assert fresh.complete(done(le.rollout_id, le.lease_id), [seq(0)]).status == AckStatus.accepted
    assert fresh.state.counters.rollouts_scored == 2 and fresh.state.journal_seq == 2


def test_a_grader_timeout_in_a_group_gets_the_failure_reward_and_a_negative_advantage() -> None:
    """A rollout whose grader timed out on the candidate's work (an endless loop) is the candidate's failure: it
    is scored 0 and trained on with a negative advantage, not left out of its group."""
    c = make(groups_per_step=1)
    leases = c.lease(LeaseRequest(runner_id="r", pool="pb", harness="codex", max=4), now=0)
    outcomes = [OutcomeKind.solved, OutcomeKind.grader_timeout, OutcomeKind.solved, OutcomeKind.grader_no_reward]
    acks = [c.complete(done(le.rollout_id, le.lease_id, o, 1.0 if o == OutcomeKind.solved else 0.0),
                       [seq(0, le.rollout_id)]) for le, o in zip(leases, outcomes, strict=True)]
    assert [a.scored for a in acks] == [True] * 4 and acks[1].reward == acks[3].reward == 0.0
    batch = c.take_batch(1)
    assert batch is not None and len(batch.groups[0].rollouts) == 4
    advs = {r.rollout_id: r.advantage for r in batch.groups[0].rollouts}
    assert advs[leases[1].rollout_id] < 0 and advs[leases[3].rollout_id] < 0 < advs[leases[0].rollout_id]
    counts = c.state.counters.pools["pb"]
    assert (counts.completed, counts.failed, counts.grader_failures) == (2, 2, 2)
