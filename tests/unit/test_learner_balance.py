"""grpo.lossBalance: each rollout (or harness) carries an equal share of an update's loss, however many sequences
and tokens it captured; "token" leaves the loss as the loss type defines it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from harnessrl.runtime.contracts.learner_config import AdapterConfig, Balance, GrpoConfig, ModelConfig
from harnessrl.runtime.learner.balance import balanced
from harnessrl.runtime.learner.packing import Sample
from harnessrl.runtime.learner.trainer import PolicyTrainer, load_policy
from harnessrl.runtime.trajectory.models import TrainingSequence


def sample(rollout: str, harness: str, loss_tokens: int, advantage: float = 1.0, seed: int = 0) -> Sample:
    g = torch.Generator().manual_seed(seed)
    n = 4 + loss_tokens
    ids = torch.randint(1, 200, (n,), generator=g).tolist()
    seq = TrainingSequence(session_id=rollout, node_ids=[0], token_ids=ids, loss_mask=[0] * 4 + [1] * loss_tokens,
                           logprobs=[0.0] * 4 + [-5.0] * loss_tokens, policy_versions=[0] * n)
    return Sample(sequence=seq, advantage=advantage, rollout=rollout, harness=harness)


def shares(samples: list[Sample], key: str) -> dict[str, float]:
    """Each rollout's (or harness's) part of Σ weight × loss tokens, the weight being the advantage's scaling."""
    out: dict[str, float] = {}
    for s in samples:
        k = s.rollout if key == "rollout" else s.harness
        out[k] = out.get(k, 0.0) + abs(s.advantage) * sum(s.sequence.loss_mask[1:])
    return out


# A long rollout split into three sequences, a short one, and a third under another harness.
MIX = [sample("a", "claude-code", 30), sample("a", "claude-code", 20), sample("a", "claude-code", 10),
       sample("b", "claude-code", 5, -1.0), sample("c", "opencode", 15)]


def test_token_balance_leaves_the_samples_as_they_are() -> None:
    assert balanced(MIX, "token", per_sequence=False) is MIX


def test_rollout_balance_gives_each_rollout_an_equal_share_and_keeps_the_scale() -> None:
    out = balanced(MIX, "rollout", per_sequence=False)
    assert shares(out, "rollout") == pytest.approx({"a": 80 / 3, "b": 80 / 3, "c": 80 / 3})
    assert [s.advantage > 0 for s in out] == [s.advantage > 0 for s in MIX]  # signs kept: no clip decision moves


def test_harness_balance_splits_equally_per_harness_then_per_rollout() -> None:
    out = balanced(MIX, "harness", per_sequence=False)
    assert shares(out, "harness") == pytest.approx({"claude-code": 40.0, "opencode": 40.0})
    assert shares(out, "rollout") == pytest.approx({"a": 20.0, "b": 20.0, "c": 40.0})


def test_per_sequence_losses_count_sequences_not_tokens() -> None:
    out = balanced(MIX, "rollout", per_sequence=True)
    per_rollout: dict[str, float] = {}
    for s in out:
        per_rollout[s.rollout] = per_rollout.get(s.rollout, 0.0) + abs(s.advantage)
    assert per_rollout == pytest.approx({"a": 5 / 3, "b": 5 / 3, "c": 5 / 3})


def step_loss(model_dir: Path, samples: list[Sample], balance: Balance) -> float:
    model = load_policy(ModelConfig(path=model_dir, served_name="tiny", dtype="float32", device="cpu"),
                        AdapterConfig(kind="full"))
    trainer = PolicyTrainer(model, GrpoConfig(lr=0.0, max_grad_norm=None, loss_balance=balance))
    return trainer.step(samples).loss


def test_a_rollout_split_into_more_sequences_weighs_the_same_under_rollout_balance(tiny_model_dir: Path) -> None:
    one, other = sample("a", "h", 12, 1.0, seed=1), sample("b", "h", 12, -1.0, seed=2)
    split = [one, sample("a", "h", 12, 1.0, seed=3), other]  # rollout a captured a second sequence
    assert step_loss(tiny_model_dir, split, "rollout") != pytest.approx(step_loss(tiny_model_dir, split, "token"))
    # Under rollout balance, rollout a's share of the loss is its mean token loss, however it is split.
    mean_a = (step_loss(tiny_model_dir, [split[0]], "token") + step_loss(tiny_model_dir, [split[1]], "token")) / 2
    mean_b = step_loss(tiny_model_dir, [other], "token")
    assert step_loss(tiny_model_dir, split, "rollout") == pytest.approx((mean_a + mean_b) / 2, rel=1e-5)
