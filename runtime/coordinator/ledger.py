"""The evaluation ledger: one rollout per (pool × task × attempt), their completions, pass@1.

Used by the standalone evaluation (runtime/evaluation) and by the learner's evaluation rounds. Leases follow the
lease machine (leases.py). A rollout is pending → leased → scored, or after an unscored outcome (infra or grader
failure: nothing about the policy) pending again until it has failed `max_unscored` times, then it is recorded as
unscored for good. An expired lease counts as such a failure, so a rollout that keeps killing its runner cannot
stall the evaluation. Whichever completion of a rollout arrives first is the one counted, later ones are
duplicates. Unlike training there are no groups to fill and no policy updates: the ledger is done when every
rollout is final. No I/O; time is passed in.
"""

from __future__ import annotations

from enum import StrEnum

from harnessrl.runtime.contracts.coordinator import (
    SCORED_OUTCOMES,
    AckStatus,
    Completion,
    CompletionAck,
    Lease,
    LeaseRequest,
    OutcomeKind,
    PoolHarness,
    PoolScore,
)
from harnessrl.runtime.coordinator import leases
from pydantic import BaseModel, Field


class EvalError(leases.CoordinatorError):
    """A request an evaluation refuses (a pool it does not evaluate, the wrong harness for a pool)."""


UnknownRollout = leases.UnknownRollout


class SlotStatus(StrEnum):
    pending = "pending"
    leased = "leased"
    scored = "scored"
    unscored = "unscored"  # failed for reasons outside the policy `max_unscored` times: left out of pass@1


FINAL = frozenset({SlotStatus.scored, SlotStatus.unscored})


class Slot(leases.LeasedSlot):
    pool: str
    harness: str
    task_id: str
    attempt: int = Field(ge=0, description="which sample of this task under this pool (0-based)")
    status: SlotStatus = SlotStatus.pending
    unscored_failures: int = 0
    outcome: OutcomeKind | None = None
    correctness: float = 0.0
    tool_calls: int = 0
    error: str | None = None


class Ledger(BaseModel):
    slots: dict[str, Slot]
    leases_expired: int = 0
    duplicates: int = 0


def rollout_id(pool: str, task_id: str, attempt: int, prefix: str = "") -> str:
    return f"{prefix}{pool}/{task_id}/a{attempt}"


def plan_ledger(pools: list[PoolHarness], task_ids: list[str], attempts: int, prefix: str = "") -> Ledger:
    """Every rollout of the evaluation, ordered task-major so that partial progress covers every pool evenly.
    `prefix` starts every rollout id (an evaluation inside training tells its rollouts from training's by it)."""
    if not pools:
        raise EvalError("no harness pool to evaluate")
    if not task_ids:
        raise EvalError("no task to evaluate")
    if attempts < 1:
        raise EvalError(f"attempts must be at least 1, got {attempts}")
    slots = [
        Slot(rollout_id=rollout_id(p.pool, t, a, prefix), pool=p.pool, harness=p.harness, task_id=t, attempt=a)
        for a in range(attempts)
        for t in task_ids
        for p in pools
    ]
    return Ledger(slots={s.rollout_id: s for s in slots})


def expire(ledger: Ledger, now: float, max_unscored: int) -> int:
    """Leases past their deadline: the rollout is pending again. An expiry counts as an unscored failure, so a
    rollout that keeps killing its runner is given up (unscored) instead of being handed out forever."""
    expired = leases.expire(ledger.slots.values(), now)
    for s in expired:
        s.unscored_failures += 1
        if s.unscored_failures >= max_unscored:
            s.status, s.outcome, s.error = SlotStatus.unscored, OutcomeKind.infra_error, f"no completion in {s.leases} leases"
    ledger.leases_expired += len(expired)
    return len(expired)


def lease(
    ledger: Ledger,
    req: LeaseRequest,
    now: float,
    ttl_s: float,
    model: str,
    proxy_url: str,
    policy_version: int,
    max_unscored: int,
) -> list[Lease]:
    """Up to `req.max` pending rollouts of the runner's pool (expired leases first become pending again)."""
    expire(ledger, now, max_unscored)
    mine = [s for s in ledger.slots.values() if s.pool == req.pool]
    if not mine:
        pools = sorted({s.pool for s in ledger.slots.values()})
        raise EvalError(f"pool {req.pool!r} is not evaluated here (pools: {', '.join(pools)})")
    if mine[0].harness != req.harness:
        raise EvalError(f"pool {req.pool!r} runs harness {mine[0].harness!r} in this eval, runner says {req.harness!r}")
    out: list[Lease] = []
    for s in mine:
        if len(out) >= req.max:
            break
        if s.status != SlotStatus.pending:
            continue
        leases.grant(s, req.runner_id, now, ttl_s)
        assert s.lease_id is not None and s.lease_deadline is not None
        out.append(
            Lease(
                rollout_id=s.rollout_id,
                lease_id=s.lease_id,
                task_id=s.task_id,
                harness=s.harness,
                pool=s.pool,
                group_id=f"{s.pool}/{s.task_id}",
                policy_version=policy_version,
                model=model,
                proxy_url=proxy_url,
                lease_deadline=s.lease_deadline,
                training=False,
            )
        )
    return out


def duplicate_ack(ledger: Ledger, c: Completion) -> CompletionAck | None:
    """The ack of a completion that would change nothing (a repeat of a finished lease, or any completion of a
    final rollout), or None when it is new. Reads only."""
    slot = ledger.slots.get(c.rollout_id)
    if slot is None:
        raise UnknownRollout(f"unknown rollout id {c.rollout_id!r}")
    if not leases.is_lease_of(c.rollout_id, c.lease_id):
        raise EvalError(f"lease {c.lease_id!r} is not a lease of rollout {c.rollout_id!r}")
    if slot.status in FINAL or leases.repeated(slot, c.lease_id):
        return CompletionAck(rollout_id=c.rollout_id, status=AckStatus.duplicate, scored=slot.status == SlotStatus.scored)
    return None


def complete(ledger: Ledger, c: Completion, max_unscored: int) -> CompletionAck:
    """Record a completion. Idempotent: a duplicate (see duplicate_ack) changes nothing but the count."""
    dup = duplicate_ack(ledger, c)
    if dup is not None:
        ledger.duplicates += 1
        return dup
    slot = ledger.slots[c.rollout_id]
    free = leases.finish(slot, c.lease_id)
    if c.outcome in SCORED_OUTCOMES:
        # The first scored completion of a rollout counts, from whichever lease; another live lease's is a duplicate.
        leases.settle(slot, SlotStatus.scored)
        slot.outcome, slot.tool_calls, slot.error = c.outcome, c.tool_calls, c.error
        # A solved rollout is fully correct whatever the runner sent; the rest keep the grader's partial credit.
        slot.correctness = 1.0 if c.outcome == OutcomeKind.solved else c.correctness
        return CompletionAck(rollout_id=c.rollout_id, status=AckStatus.accepted, scored=True, reward=slot.correctness)
    slot.unscored_failures += 1
    slot.outcome, slot.tool_calls, slot.error = c.outcome, c.tool_calls, c.error
    if free:  # else the live lease decides: its own completion or its expiry counts a failure too
        leases.settle(slot, SlotStatus.unscored if slot.unscored_failures >= max_unscored else SlotStatus.pending)
    return CompletionAck(rollout_id=c.rollout_id, status=AckStatus.accepted, scored=False)


def done(ledger: Ledger) -> bool:
    return all(s.status in FINAL for s in ledger.slots.values())


# -- pass@1 -----------------------------------------------------------------------------------------------------


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def pool_scores(ledger: Ledger) -> list[PoolScore]:
    by_pool: dict[str, list[Slot]] = {}
    for s in ledger.slots.values():
        by_pool.setdefault(s.pool, []).append(s)
    scores = []
    for pool, slots in by_pool.items():
        scored = [s for s in slots if s.status == SlotStatus.scored]
        solved = [s for s in scored if s.outcome == OutcomeKind.solved]
        scores.append(
            PoolScore(
                pool=pool,
                harness=slots[0].harness,
                rollouts=len(slots),
                scored=len(scored),
                solved=len(solved),
                unscored=sum(s.status == SlotStatus.unscored for s in slots),
                pending=sum(s.status not in FINAL for s in slots),
                pass_at_1=_mean([1.0 if s.outcome == OutcomeKind.solved else 0.0 for s in scored]),
                mean_correctness=_mean([s.correctness for s in scored]),
            )
        )
    return scores
