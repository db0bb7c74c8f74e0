"""Reward and group advantages. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Sequence

from harnessrl.runtime.contracts.coordinator import SCORED_OUTCOMES, OutcomeKind
from harnessrl.runtime.contracts.learner_config import RewardConfig


def reward(outcome: OutcomeKind, correctness: float, tool_calls: int, cfg: RewardConfig,
           mismatches: int = 0) -> float | None:
    """correctness × (1 + bonus × scale / (scale + tool_calls)); the bonus only when fully correct; minus
    tool_mismatch_penalty for each of the `mismatches` (tool calls the harness could not run), at most 1 in all,
    so one runaway rollout does not outweigh solving a task.

    None for outcomes that say nothing about the policy (a grader broken on the reference answer too, an
    infrastructure failure): such rollouts are unscored, which is different from a reward of 0. A grader that
    timed out or wrote no reward on the candidate's work scores 0, the task's failure reward.
    """
    if outcome not in SCORED_OUTCOMES:
        return None
    if not 0.0 <= correctness <= 1.0:
        raise ValueError(f"correctness must be in [0, 1], got {correctness}")
    if tool_calls < 0:
        raise ValueError(f"tool_calls must be >= 0, got {tool_calls}")
    # A harness error, a timeout or a grader failure earns nothing, whatever partial credit the grader reported.
    c = correctness if outcome in (OutcomeKind.solved, OutcomeKind.wrong) else 0.0
    if outcome == OutcomeKind.solved:
        c = 1.0
    bonus = cfg.bonus * cfg.scale / (cfg.scale + tool_calls) if c >= 1.0 else 0.0
    return c * (1.0 + bonus) - min(1.0, cfg.tool_mismatch_penalty * mismatches)


def _std(xs: Sequence[float]) -> float:
    """Standard deviation with Bessel's correction (as TRL's GRPO `nanstd`)."""
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def group_advantages(rewards: Sequence[float], epsilon: float, scale: str = "group",
                     baseline: str = "mean") -> list[float] | None:
    """r − baseline, divided by the group's std + ε when `scale` is "group" (TRL scale_rewards="group");
    "batch" and "none" leave the division to `scale_batch`. The baseline is the group's mean, or RLOO's mean of
    the group's other rewards (TRL's RLOOTrainer): r − (Σ − r)/(G − 1) = (r − mean) × G/(G − 1).

    Returns None when the group has no variance: every advantage would be 0, so the group teaches nothing
    and is skipped (and counted) rather than trained on.
    """
    if len(rewards) < 2:
        return None
    std = _std(rewards)
    if std <= 1e-12:
        return None
    total = sum(rewards)
    n = len(rewards)
    div = std + epsilon if scale == "group" else 1.0
    if baseline == "rloo":
        return [(r - (total - r) / (n - 1)) / div for r in rewards]
    return [(r - total / n) / div for r in rewards]


def scale_batch(advantages: list[list[float]], rewards: list[list[float]], epsilon: float, scale: str) -> list[list[float]]:
    """The step's advantages under TRL's `scale_rewards`: "batch" divides the group-centred rewards by the std
    of every reward in the step's groups + ε; "group" (already divided per group) and "none" (Dr. GRPO) keep
    them. Under "group", an all-solved group whose rewards differ only by the efficiency bonus gets the same
    ±1-sized advantages as a solved/failed group; under "batch" its advantages keep their true, small size."""
    if scale != "batch":
        return advantages
    flat = [r for rs in rewards for r in rs]
    if len(flat) < 2:
        return advantages
    div = _std(flat) + epsilon
    return [[a / div for a in adv] for adv in advantages]
