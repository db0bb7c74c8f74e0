"""The eval coordinator's ledger: one lease per (pool × task × attempt), expiry, idempotent completions,
retries of unscored outcomes, and pass@1."""

from __future__ import annotations

import pytest
from harnessrl.runtime.contracts.coordinator import AckStatus, Completion, LeaseRequest, OutcomeKind
from harnessrl.runtime.coordinator import ledger as L
from hypothesis import given, settings
from hypothesis import strategies as st

POOLS = [L.PoolHarness(pool="oneshot", harness="oneshot"), L.PoolHarness(pool="mini", harness="mini-swe-agent")]
TASKS = ["t1", "t2", "t3"]


def req(pool: str = "oneshot", harness: str = "oneshot", n: int = 100, runner: str = "r0") -> LeaseRequest:
    return LeaseRequest(runner_id=runner, pool=pool, harness=harness, max=n)


def take(ledger: L.Ledger, r: LeaseRequest, now: float = 0.0, ttl: float = 10.0, max_unscored: int = 3) -> list[L.Lease]:
    return L.lease(ledger, r, now, ttl, "tiny-eval-step-1", "http://proxy", 3, max_unscored)


def done_with(lease: L.Lease, outcome: OutcomeKind, correctness: float = 0.0) -> Completion:
    return Completion(rollout_id=lease.rollout_id, lease_id=lease.lease_id, outcome=outcome, correctness=correctness)


def test_plan_has_one_rollout_per_pool_task_attempt() -> None:
    ledger = L.plan_ledger(POOLS, TASKS, attempts=2)
    assert len(ledger.slots) == 2 * 3 * 2
    keys = {(s.pool, s.task_id, s.attempt) for s in ledger.slots.values()}
    assert len(keys) == 12
    assert all(s.harness == ("oneshot" if s.pool == "oneshot" else "mini-swe-agent") for s in ledger.slots.values())


@pytest.mark.parametrize(("pools", "tasks", "attempts", "message"), [
    ([], TASKS, 1, "no harness pool"), (POOLS, [], 1, "no task"), (POOLS, TASKS, 0, "at least 1")])
def test_plan_refuses_an_empty_evaluation(pools: list[L.PoolHarness], tasks: list[str], attempts: int, message: str) -> None:
    with pytest.raises(L.EvalError, match=message):
        L.plan_ledger(pools, tasks, attempts)


def test_leases_are_per_pool_bounded_by_max_and_never_handed_out_twice() -> None:
    ledger = L.plan_ledger(POOLS, TASKS, attempts=2)
    first = take(ledger, req(n=4))
    assert len(first) == 4 and all(x.pool == "oneshot" and x.harness == "oneshot" for x in first)
    rest = take(ledger, req(n=100))
    assert len(rest) == 2
    assert take(ledger, req()) == []
    ids = [x.rollout_id for x in first + rest]
    assert len(set(ids)) == 6
    lease = first[0]
    assert (lease.model, lease.proxy_url, lease.policy_version, lease.lease_deadline) == (
        "tiny-eval-step-1", "http://proxy", 3, 10.0)
    assert lease.group_id == f"oneshot/{lease.task_id}"
    # The other pool's rollouts are untouched.
    assert len(take(ledger, req("mini", "mini-swe-agent"))) == 6


def test_lease_refuses_unknown_pool_and_wrong_harness() -> None:
    ledger = L.plan_ledger(POOLS, TASKS, attempts=1)
    with pytest.raises(L.EvalError, match="pool 'other' is not evaluated here"):
        take(ledger, req("other", "oneshot"))
    with pytest.raises(L.EvalError, match="runs harness 'mini-swe-agent'"):
        take(ledger, req("mini", "codex"))


def test_expired_lease_is_handed_out_again_and_counted_once() -> None:
    ledger = L.plan_ledger(POOLS[:1], ["t1"], attempts=1)
    (old,) = take(ledger, req(), now=0.0, ttl=10.0)
    assert take(ledger, req(), now=5.0) == []  # still leased
    (new,) = take(ledger, req(runner="r1"), now=11.0)
    assert new.rollout_id == old.rollout_id and new.lease_id != old.lease_id
    assert ledger.leases_expired == 1
    # The slow first runner finishes after all: its completion is the one counted; the second is a duplicate.
    ack = L.complete(ledger, done_with(old, OutcomeKind.solved, 1.0), max_unscored=3)
    assert ack.status == AckStatus.accepted and ack.scored
    ack2 = L.complete(ledger, done_with(new, OutcomeKind.wrong), max_unscored=3)
    assert ack2.status == AckStatus.duplicate
    (score,) = L.pool_scores(ledger)
    assert (score.scored, score.solved, score.pass_at_1) == (1, 1, 1.0)
    assert L.done(ledger)


def test_a_rollout_whose_leases_keep_expiring_is_given_up() -> None:
    """A runner that dies on a rollout (its lease expires every time) must not keep the evaluation from ending."""
    ledger = L.plan_ledger(POOLS[:1], ["t1"], attempts=1)
    now = 0.0
    for _ in range(3):
        assert len(take(ledger, req(), now=now, ttl=10.0, max_unscored=3)) == 1
        now += 11.0
    assert take(ledger, req(), now=now, max_unscored=3) == []
    (slot,) = ledger.slots.values()
    assert slot.status == L.SlotStatus.unscored and slot.outcome == OutcomeKind.infra_error and L.done(ledger)
    assert slot.error == "no completion in 3 leases" and ledger.leases_expired == 3


def test_completions_are_idempotent() -> None:
    ledger = L.plan_ledger(POOLS[:1], ["t1", "t2"], attempts=1)
    a, _ = take(ledger, req())
    c = done_with(a, OutcomeKind.wrong)
    assert L.complete(ledger, c, 3).status == AckStatus.accepted
    before = ledger.model_dump()
    for _ in range(3):
        ack = L.complete(ledger, c, 3)
        assert ack.status == AckStatus.duplicate and ack.scored
    after = ledger.model_dump()
    assert after.pop("duplicates") == 3 and before.pop("duplicates") == 0
    assert before == after


def test_unknown_rollout_is_refused() -> None:
    ledger = L.plan_ledger(POOLS, TASKS, attempts=1)
    with pytest.raises(L.UnknownRollout):
        L.complete(ledger, Completion(rollout_id="nope", lease_id="x", outcome=OutcomeKind.solved), 3)


def test_unscored_outcomes_are_retried_then_given_up_without_counting_as_wrong() -> None:
    ledger = L.plan_ledger(POOLS[:1], ["t1"], attempts=1)
    for n in range(1, 3):
        (lease,) = take(ledger, req())
        kind = OutcomeKind.infra_error if n == 1 else OutcomeKind.grader_error
        ack = L.complete(ledger, done_with(lease, kind), max_unscored=3)
        assert ack.status == AckStatus.accepted and not ack.scored
        # A runner retrying the same report (lost ack) does not burn a retry.
        assert L.complete(ledger, done_with(lease, kind), max_unscored=3).status == AckStatus.duplicate
        assert ledger.slots[lease.rollout_id].status == L.SlotStatus.pending and not L.done(ledger)
    (lease,) = take(ledger, req())
    L.complete(ledger, done_with(lease, OutcomeKind.infra_error), max_unscored=3)
    slot = ledger.slots[lease.rollout_id]
    assert slot.status == L.SlotStatus.unscored and slot.unscored_failures == 3 and slot.leases == 3
    assert take(ledger, req()) == [] and L.done(ledger)
    (score,) = L.pool_scores(ledger)
    assert (score.scored, score.unscored, score.pending) == (0, 1, 0)
    assert score.pass_at_1 is None and score.mean_correctness is None


def test_pass_at_1_is_solved_over_scored_per_pool() -> None:
    ledger = L.plan_ledger(POOLS, ["t1", "t2"], attempts=2)  # 4 rollouts per pool
    one = take(ledger, req())
    outcomes = [(OutcomeKind.solved, 1.0), (OutcomeKind.wrong, 0.5), (OutcomeKind.timeout, 0.0),
                (OutcomeKind.infra_error, 0.0)]
    for lease, (kind, corr) in zip(one, outcomes, strict=True):
        L.complete(ledger, done_with(lease, kind, corr), max_unscored=1)
    mini = take(ledger, req("mini", "mini-swe-agent"))
    for lease in mini:
        L.complete(ledger, done_with(lease, OutcomeKind.solved, 1.0), max_unscored=1)
    scores = {s.pool: s for s in L.pool_scores(ledger)}
    # oneshot: 3 scored (solved, wrong, timeout), 1 unscored; pass@1 = 1/3, partial credit only in the mean.
    o = scores["oneshot"]
    assert (o.rollouts, o.scored, o.solved, o.unscored, o.pending) == (4, 3, 1, 1, 0)
    assert o.pass_at_1 == pytest.approx(1 / 3)
    assert o.mean_correctness == pytest.approx(1.5 / 3)
    m = scores["mini"]
    assert (m.harness, m.scored, m.pass_at_1) == ("mini-swe-agent", 4, 1.0)
    assert L.done(ledger)


def test_solved_counts_as_fully_correct_whatever_the_runner_sent() -> None:
    ledger = L.plan_ledger(POOLS[:1], ["t1"], attempts=1)
    (lease,) = take(ledger, req())
    ack = L.complete(ledger, done_with(lease, OutcomeKind.solved, 0.0), max_unscored=1)
    assert ack.reward == 1.0


events = st.lists(
    st.tuples(
        st.sampled_from(["lease", "complete", "repeat", "tick"]),
        st.sampled_from(list(OutcomeKind)),
        st.integers(0, 7),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(events)
def test_accounting_invariants_under_any_interleaving(script: list[tuple[str, OutcomeKind, int]]) -> None:
    """Whatever order leases, completions, repeats and expiries come in: every rollout is in exactly one
    state, no rollout is scored twice, and each pool's pass@1 is the share of its scored completions that were
    solved, counted here from the acknowledgements."""
    ledger = L.plan_ledger(POOLS, ["t1", "t2"], attempts=2)
    now = 0.0
    held: list[L.Lease] = []
    accepted_scored: list[str] = []
    solved_by_pool: dict[str, list[bool]] = {}
    for action, outcome, k in script:
        if action == "lease":
            pool = POOLS[k % 2]
            held += take(ledger, req(pool.pool, pool.harness, n=1 + k % 3), now=now, ttl=5.0)
        elif action in ("complete", "repeat") and held:
            lease = held[k % len(held)]
            if action == "complete":
                held.remove(lease)
            ack = L.complete(ledger, done_with(lease, outcome, 1.0 if outcome == OutcomeKind.solved else 0.0), 2)
            if ack.status == AckStatus.accepted and ack.scored:
                accepted_scored.append(lease.rollout_id)
                solved_by_pool.setdefault(lease.pool, []).append(outcome == OutcomeKind.solved)
        else:
            now += 1.0 + k
    assert len(accepted_scored) == len(set(accepted_scored))
    scored = [s for s in ledger.slots.values() if s.status == L.SlotStatus.scored]
    assert sorted(s.rollout_id for s in scored) == sorted(accepted_scored)
    for score in L.pool_scores(ledger):
        assert score.scored + score.unscored + score.pending == score.rollouts == 4
        solved = solved_by_pool.get(score.pool, [])
        assert (score.scored, score.solved) == (len(solved), sum(solved))
        assert score.pass_at_1 == (sum(solved) / len(solved) if solved else None)
    assert L.done(ledger) == all(s.status in L.FINAL for s in ledger.slots.values())


def test_a_policy_that_hangs_the_grader_scores_as_one_that_answers_wrong() -> None:
    """Breaking the grader on the tasks it cannot solve must not shrink a policy's denominator."""
    def pass_at_1(failure: OutcomeKind) -> float | None:
        ledger = L.plan_ledger(POOLS[:1], TASKS, attempts=1)
        for lease in take(ledger, req()):
            outcome = OutcomeKind.solved if lease.task_id == "t1" else failure
            L.complete(ledger, done_with(lease, outcome, 1.0 if outcome == OutcomeKind.solved else 0.0), 1)
        assert L.done(ledger)
        return L.pool_scores(ledger)[0].pass_at_1

    assert pass_at_1(OutcomeKind.wrong) == pytest.approx(1 / 3)
    assert pass_at_1(OutcomeKind.grader_timeout) == pass_at_1(OutcomeKind.grader_no_reward) == pytest.approx(1 / 3)
