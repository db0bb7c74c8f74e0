"""Reward, group advantages (checked against TRL's own nanstd) and harness/task rotation."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from harnessrl.runtime.contracts.coordinator import OutcomeKind
from harnessrl.runtime.contracts.learner_config import GrpoConfig, HarnessWeight, RewardConfig
from harnessrl.runtime.learner.reward import group_advantages, reward, scale_batch
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


def test_tool_calls_the_harness_cannot_run_cost_what_the_penalty_says_at_most_one() -> None:
    penalised = RewardConfig(bonus=0.1, scale=15.0, tool_mismatch_penalty=0.25)
    assert reward(OutcomeKind.solved, 1.0, 0, CFG, mismatches=3) == pytest.approx(1.1)  # off by default
    assert reward(OutcomeKind.solved, 1.0, 0, penalised, mismatches=2) == pytest.approx(1.1 - 0.5)
    assert reward(OutcomeKind.wrong, 0.0, 0, penalised, mismatches=9) == pytest.approx(-1.0)
    assert reward(OutcomeKind.infra_error, 0.0, 0, penalised, mismatches=9) is None


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


def test_rloo_advantages_match_trls_leave_one_out_baseline() -> None:
    # TRL's RLOOTrainer (trl 1.16, rloo_trainer.py): baseline = (group sum − own reward) / (scorable − 1), advantage
    # = reward − baseline, no normalisation by default (normalize_advantages=False: our scale_rewards "none").
    groups = [[0.0, 1.1, 1.05, 0.0, 0.3, 0.0, 1.1, 0.0], [1.0, 0.0, 0.0, 1.0]]
    for rewards in groups:
        t = torch.tensor(rewards, dtype=torch.float64).view(1, -1)
        expected = (t - (t.sum(1, keepdim=True) - t) / (t.size(1) - 1)).view(-1).tolist()
        got = group_advantages(rewards, 1e-4, "none", baseline="rloo")
        assert got == pytest.approx(expected, rel=1e-12)
        mean_based = group_advantages(rewards, 1e-4, "none")
        assert mean_based is not None and got != pytest.approx(mean_based)  # RLOO's G/(G−1) larger steps
    # With a scale, RLOO's advantages are divided like the mean baseline's: the group's std + ε.
    rewards = groups[0]
    std = float(nanstd(torch.tensor(rewards)))
    scaled = group_advantages(rewards, 1e-4, "group", baseline="rloo")
    unscaled = group_advantages(rewards, 1e-4, "none", baseline="rloo")
    assert scaled is not None and unscaled is not None
    assert scaled == pytest.approx([a / (std + 1e-4) for a in unscaled], rel=1e-6)


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


def test_under_the_default_scaling_the_bonus_no_longer_outweighs_solving() -> None:
    # Defect 5: with per-group std normalisation, an all-solved group's small tool-call differences became
    # advantages of about ±1.5, larger than a solved/failed group's ±0.94.
    cfg = RewardConfig()
    solved = [reward(OutcomeKind.solved, 1.0, calls, cfg) for calls in (2, 3, 5, 8, 10, 12, 20, 30)]
    mixed = [reward(o, c, 6, cfg) for o, c in [(OutcomeKind.solved, 1.0)] * 4 + [(OutcomeKind.wrong, 0.0)] * 4]
    rewards = [[r for r in solved if r is not None], [r for r in mixed if r is not None]]

    def biggest(scale: str) -> tuple[float, float]:
        centred = [group_advantages(rs, 1e-4, scale) for rs in rewards]
        assert all(c is not None for c in centred)
        adv = scale_batch([c for c in centred if c is not None], rewards, 1e-4, scale)
        return max(abs(a) for a in adv[0]), max(abs(a) for a in adv[1])

    all_solved, solved_failed = biggest("group")
    assert all_solved > 1.4 and solved_failed == pytest.approx(0.935, abs=0.01) and all_solved > solved_failed
    default = GrpoConfig().scale_rewards
    assert default == "batch"
    all_solved, solved_failed = biggest(default)
    assert all_solved < 0.1 * solved_failed  # the bonus still orders solved rollouts, but cannot outweigh solving
    all_solved, solved_failed = biggest("none")
    assert all_solved < 0.1 * solved_failed
