"""Reward, group advantages (checked against TRL's own nanstd) and harness/task rotation."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from harnessrl.runtime.contracts.coordinator import OutcomeKind
from harnessrl.runtime.learner.config import HarnessWeight, RewardConfig
from harnessrl.runtime.learner.reward import group_advantages, reward
from harnessrl.runtime.learner.schedule import GroupPlanner, swrr_cycle, task_for_group
from trl.trainer.utils import nanstd

CFG = RewardConfig(bonus=0.1, scale=15.0)


def test_reward_bonus_only_when_correct() -> None:
    assert reward(OutcomeKind.solved, 1.0, 0, CFG) == pytest.approx(1.1)
    assert reward(OutcomeKind.solved, 1.0, 15, CFG) == pytest.approx(1.05)
    assert reward(OutcomeKind.solved, 0.0, 5, CFG) == pytest.approx(1.0 + 0.1 * 15 / 20)  # solved means correct
    assert reward(OutcomeKind.wrong, 0.5, 0, CFG) == pytest.approx(0.5)  # partial credit, no bonus
    assert reward(OutcomeKind.wrong, 0.0, 0, CFG) == 0.0
    assert reward(OutcomeKind.timeout, 0.9, 3, CFG) == 0.0
    assert reward(OutcomeKind.harness_error, 1.0, 3, CFG) == 0.0


def test_reward_fewer_tool_calls_score_higher() -> None:
    values = [reward(OutcomeKind.solved, 1.0, n, CFG) for n in range(0, 50, 5)]
    assert values == sorted(values, reverse=True)
    assert all(1.0 < v <= 1.1 for v in values if v is not None)


@pytest.mark.parametrize("outcome", [OutcomeKind.infra_error, OutcomeKind.grader_error])
def test_infra_failures_are_unscored(outcome: OutcomeKind) -> None:
    assert reward(outcome, 1.0, 0, CFG) is None


def test_reward_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="correctness"):
        reward(OutcomeKind.wrong, 1.5, 0, CFG)
    with pytest.raises(ValueError, match="tool_calls"):
        reward(OutcomeKind.wrong, 0.5, -1, CFG)


def test_advantages_match_trl_normalisation() -> None:
    rewards = [0.0, 1.1, 1.05, 0.0, 0.3, 0.0, 1.1, 0.0]
    t = torch.tensor(rewards, dtype=torch.float64)
    expected = ((t - t.mean()) / (nanstd(t) + 1e-4)).tolist()
    got = group_advantages(rewards, 1e-4)
    assert got is not None
    assert got == pytest.approx(expected, rel=1e-6)  # TRL computes the Bessel factor in float32
    assert math.fsum(got) == pytest.approx(0.0, abs=1e-9)


def test_zero_variance_group_is_none() -> None:
    assert group_advantages([0.0] * 8, 1e-4) is None
    assert group_advantages([1.1] * 4, 1e-4) is None
    assert group_advantages([1.0], 1e-4) is None


def test_swrr_is_smooth_and_weighted() -> None:
    hs = [HarnessWeight(pool="a", harness="x", weight=3), HarnessWeight(pool="b", harness="y", weight=1)]
    cycle = swrr_cycle(hs)
    assert cycle == [0, 0, 1, 0]
    hs3 = [HarnessWeight(pool=p, harness=p, weight=w) for p, w in (("a", 5), ("b", 1), ("c", 1))]
    c3 = swrr_cycle(hs3)
    assert Counter(c3) == {0: 5, 1: 1, 2: 1}
    assert c3 == [0, 0, 1, 0, 2, 0, 0]  # nginx's example: a a b a c a a


def test_tasks_each_once_per_epoch_and_deterministic() -> None:
    tasks = [f"t{i}" for i in range(7)]
    epoch0 = [task_for_group(tasks, k, 3, True) for k in range(7)]
    epoch1 = [task_for_group(tasks, k, 3, True) for k in range(7, 14)]
    assert sorted(epoch0) == sorted(tasks) == sorted(epoch1)
    assert epoch0 != epoch1  # reshuffled per epoch
    assert epoch0 == [task_for_group(tasks, k, 3, True) for k in range(7)]
    assert [task_for_group(tasks, k, 3, False) for k in range(7)] == tasks


def test_planner_pairs_tasks_and_harnesses() -> None:
    hs = [HarnessWeight(pool="a", harness="x", weight=2), HarnessWeight(pool="b", harness="y", weight=1)]
    planner = GroupPlanner(["t0", "t1"], hs, seed=0, shuffle=False)
    plans = [planner.plan(k) for k in range(6)]
    assert [p[1].pool for p in plans] == ["a", "b", "a", "a", "b", "a"]
    assert [p[0] for p in plans] == ["t0", "t1"] * 3
