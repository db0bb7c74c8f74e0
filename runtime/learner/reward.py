"""Reward and group advantages. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Sequence

from harnessrl.runtime.contracts.coordinator import SCORED_OUTCOMES, OutcomeKind
from harnessrl.runtime.learner.config import RewardConfig


def reward(outcome: OutcomeKind, correctness: float, tool_calls: int, cfg: RewardConfig) -> float | None:
    """correctness × (1 + bonus × scale / (scale + tool_calls)); the bonus only when fully correct.

    None for outcomes that say nothing about the policy (grader or infrastructure failures): such rollouts
    are unscored, which is different from a reward of 0.
    """
    if outcome not in SCORED_OUTCOMES:
        return None
    if not 0.0 <= correctness <= 1.0:
        raise ValueError(f"correctness must be in [0, 1], got {correctness}")
    if tool_calls < 0:
        raise ValueError(f"tool_calls must be >= 0, got {tool_calls}")
    # A harness error or a timeout earns nothing, whatever partial credit the grader reported.
    c = correctness if outcome in (OutcomeKind.solved, OutcomeKind.wrong) else 0.0
    if outcome == OutcomeKind.solved:
        c = 1.0
    bonus = cfg.bonus * cfg.scale / (cfg.scale + tool_calls) if c >= 1.0 else 0.0
    return c * (1.0 + bonus)


def group_advantages(rewards: Sequence[float], epsilon: float) -> list[float] | None:
    """(r − mean) / (std + ε) within a group, std with Bessel's correction (as TRL's GRPO `nanstd`).

    Returns None when the group has no variance: every advantage would be 0, so the group teaches nothing
    and is skipped (and counted) rather than trained on.
    """
    if len(rewards) < 2:
        return None
    mean = sum(rewards) / len(rewards)
    var = sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)
    std = math.sqrt(var)
    if std <= 1e-12:
        return None
    return [(r - mean) / (std + epsilon) for r in rewards]
