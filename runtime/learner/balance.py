"""Loss balance: what share of an update's loss each rollout carries, however many sequences and tokens it captured.

GRPO losses average over tokens (dapo, dr_grpo) or sequences (grpo), so a rollout weighs what it captured: a
harness whose rollouts run long, or split into many sequences (history rewrites, sub-agents), dominates a
multi-harness update. `balanced` weighs each rollout equally ("rollout"), or each harness equally and each
rollout equally within it ("harness"); "token" leaves the loss as the loss type defines it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from harnessrl.runtime.contracts.learner_config import Balance
from harnessrl.runtime.learner.packing import Sample


def balanced(samples: list[Sample], balance: Balance, per_sequence: bool) -> list[Sample]:
    """`samples` with each one's advantage scaled by its weight, so that each rollout ("rollout"), or each harness
    and within it each rollout ("harness"), carries an equal share of the loss.

    The loss averages over units (loss tokens; sequences when `per_sequence`, loss type grpo); a sample's weight
    is (all units) × (its rollout's share) / (its rollout's units), so the weights of all units still sum to
    the number of units and the loss keeps its scale. The clipped surrogate is positively homogeneous in the
    advantage, so scaling the advantage by the weight scales the sample's token losses by it and changes no
    clipping decision."""
    if balance == "token" or not samples:
        return samples
    units = [1 if per_sequence else sum(s.sequence.loss_mask[1:]) for s in samples]
    rollout_units: Counter[str] = Counter()
    for s, u in zip(samples, units, strict=True):
        rollout_units[s.rollout] += u
    harness_of = {s.rollout: s.harness for s in samples}
    rollouts_per_harness = Counter(harness_of.values())
    total = sum(units)

    def share(rollout: str) -> float:
        if balance == "rollout":
            return 1 / len(rollout_units)
        return 1 / (len(rollouts_per_harness) * rollouts_per_harness[harness_of[rollout]])

    return [replace(s, advantage=s.advantage * total * share(s.rollout) / rollout_units[s.rollout])
            for s in samples]
