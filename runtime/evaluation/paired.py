"""Paired comparison of two checkpoints evaluated on the same tasks. Pure.

A pair is one (pool, task, attempt) scored under both checkpoints. Pairs both solve or both fail say nothing about
which checkpoint is better, so the exact McNemar test looks only at the discordant ones; it detects a change that
two overlapping pass@1 intervals cannot. On the pairs both solve, the mean tool calls under each checkpoint show
whether training made the agent more economical at equal success.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import fmean

from harnessrl.runtime.contracts.coordinator import OutcomeKind
from harnessrl.runtime.coordinator.ledger import Slot, SlotStatus
from pydantic import BaseModel, Field


class Comparison(BaseModel):
    """`checkpoint` against `reference` under one pool, on the pairs scored under both."""

    pool: str
    harness: str
    reference: str
    checkpoint: str
    pairs: int = Field(ge=0)
    gained: int = Field(ge=0, description="pairs solved under the checkpoint only (McNemar's b)")
    lost: int = Field(ge=0, description="pairs solved under the reference only (McNemar's c)")
    p_value: float = Field(ge=0.0, le=1.0, description="two-sided exact McNemar test")
    both_solved: int = Field(ge=0)
    reference_tool_calls: float | None = Field(description="mean tool calls on the pairs both solved; None: no such pair")
    tool_calls: float | None = Field(description="the same under the checkpoint")

    @property
    def tool_call_change(self) -> float | None:
        """Relative change in mean tool calls on the pairs both solved (-0.31: 31% fewer); None when the reference
        mean is missing or zero."""
        if not self.reference_tool_calls or self.tool_calls is None:
            return None
        return self.tool_calls / self.reference_tool_calls - 1


def mcnemar_p(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value. With no difference between the checkpoints each discordant pair is a fair
    coin, so the smaller count is Binomial(gained + lost, 1/2); its lower tail, doubled and capped at 1."""
    n = gained + lost
    term = tail = 1  # C(n, 0)
    for k in range(min(gained, lost)):
        term = term * (n - k) // (k + 1)  # C(n, k + 1), exactly; summing math.comb is quadratic: minutes at 40k pairs
        tail += term
    return min(1.0, 2 * tail / 2**n)  # integers until this one division, which Python rounds correctly at any n


def _scored(slots: Sequence[Slot]) -> dict[tuple[str, str, int], Slot]:
    return {(s.pool, s.task_id, s.attempt): s for s in slots if s.status == SlotStatus.scored}


def _solved(slot: Slot) -> bool:
    return slot.outcome == OutcomeKind.solved


def compare(reference: str, reference_slots: Sequence[Slot], checkpoint: str,
            checkpoint_slots: Sequence[Slot]) -> list[Comparison]:
    """One comparison per pool evaluated under both (in the reference's pool order); a pool without a pair scored
    under both has pairs 0 and p 1."""
    before, after = _scored(reference_slots), _scored(checkpoint_slots)
    evaluated = {s.pool for s in checkpoint_slots}
    pools = {s.pool: s.harness for s in reference_slots if s.pool in evaluated}
    comparisons = []
    for pool, harness in pools.items():
        pairs = [(a, after[key]) for key, a in before.items() if key[0] == pool and key in after]
        gained = sum(_solved(b) and not _solved(a) for a, b in pairs)
        lost = sum(_solved(a) and not _solved(b) for a, b in pairs)
        both = [(a, b) for a, b in pairs if _solved(a) and _solved(b)]
        comparisons.append(Comparison(
            pool=pool, harness=harness, reference=reference, checkpoint=checkpoint, pairs=len(pairs),
            gained=gained, lost=lost, p_value=mcnemar_p(gained, lost), both_solved=len(both),
            reference_tool_calls=fmean(a.tool_calls for a, _ in both) if both else None,
            tool_calls=fmean(b.tool_calls for _, b in both) if both else None,
        ))
    return comparisons


def paired_comparisons(slots: Mapping[str, Sequence[Slot]]) -> list[Comparison]:
    """Every checkpoint after the first (in `slots`' order: label -> its evaluation's slots) against the first."""
    labels = list(slots)
    return [c for label in labels[1:] for c in compare(labels[0], slots[labels[0]], label, slots[label])]
