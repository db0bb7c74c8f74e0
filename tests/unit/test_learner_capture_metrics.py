"""Step metrics of what the proxy captured: training sequences per rollout, sampled tokens, and tokens that repeat a
shared prefix, per harness."""

from __future__ import annotations

from pathlib import Path

from harnessrl.runtime.learner.coordinator import TrainGroup, TrainRollout
from harnessrl.runtime.learner.metrics import (
    MetricsSink,
    StepMetrics,
    captured_by_harness,
    repeated_prefix_tokens,
    trained_by_harness,
)
from harnessrl.runtime.trajectory.models import TrainingSequence
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest


def sequence(loss_tokens: int, prompt: tuple[int, int] = (0, 1)) -> TrainingSequence:
    n = 2 + loss_tokens
    return TrainingSequence(session_id="s", node_ids=[0], token_ids=[*prompt, *range(2, n)],
                            loss_mask=[0, 0] + [1] * loss_tokens,
                            logprobs=[0.0, 0.0] + [-1.0] * loss_tokens, policy_versions=[0] * n)


def group(harness: str, *rollouts: list[int]) -> TrainGroup:
    return TrainGroup(group_id=f"g-{harness}", task_id="t", harness=harness, rollouts=[
        TrainRollout(rollout_id=f"{harness}-{i}", reward=0.0, advantage=0.0, sequences=[sequence(n) for n in seqs])
        for i, seqs in enumerate(rollouts)])


def recorded(tmp_path: Path, **per_harness: dict[str, float] | dict[str, int]) -> tuple[StepMetrics, str]:
    """A step's record with the per-harness fields given, as the sink reads it back, and its Prometheus text."""
    sink = MetricsSink(tmp_path / "metrics.jsonl")
    sink.record(StepMetrics(
        step=1, policy_version=1, time=0.0, rollouts_scored=4, rollouts_unscored=0, rollouts_stale=0, groups_trained=2,
        groups_zero_variance=0, mean_reward=0.5, loss=0.0, clip_fraction=0.0, kl=0.0, tokens=40, loss_tokens=27,
        tokens_per_s=1.0, step_s=1.0, sync_s=0.0, grad_norm=0.0, **per_harness))
    return sink.history()[0], generate_latest(sink.registry).decode()


def test_sequences_per_rollout_and_tokens_per_harness_reach_the_step_record_and_prometheus(tmp_path: Path) -> None:
    # Claude Code split one rollout into three sequences; OpenCode kept each rollout in one.
    groups = [group("claude-code", [5, 4, 3], [6]), group("opencode", [7], [2])]
    per_rollout, tokens = captured_by_harness(groups)
    assert per_rollout == {"claude-code": 2.0, "opencode": 1.0}
    assert tokens == {"claude-code": 18, "opencode": 9}
    record, exposed = recorded(tmp_path, sequences_per_rollout_by_harness=per_rollout, loss_tokens_by_harness=tokens)
    assert record.sequences_per_rollout_by_harness == per_rollout
    assert 'harnessrl_learner_sequences_per_rollout{harness="claude-code"} 2.0' in exposed
    assert 'harnessrl_learner_loss_tokens{harness="opencode"} 9.0' in exposed


def test_a_step_counts_the_tokens_it_trains_again_as_a_shared_prefix_per_harness(tmp_path: Path) -> None:
    # Claude Code's three sequences run alike as far as each goes (a prefix tree holds the longest's 8 tokens: 5 + 6
    # are repeated); OpenCode's two differ from their first token.
    trained = [("claude-code", sequence(4)), ("claude-code", sequence(3)), ("claude-code", sequence(6)),
               ("opencode", sequence(1)), ("opencode", sequence(1, prompt=(7, 1)))]
    tokens, repeated = trained_by_harness(trained)
    assert tokens == {"claude-code": 6 + 5 + 8, "opencode": 3 + 3}
    assert repeated == {"claude-code": 5 + 6, "opencode": 0}
    record, exposed = recorded(tmp_path, tokens_by_harness=tokens, repeated_prefix_tokens_by_harness=repeated)
    assert record.repeated_prefix_tokens_by_harness == repeated
    assert 'harnessrl_learner_repeated_prefix_tokens{harness="claude-code"} 11.0' in exposed


@given(st.lists(st.lists(st.integers(0, 3), max_size=8), max_size=6))
def test_repeated_prefix_tokens_are_the_tokens_a_prefix_tree_would_not_hold_again(seqs: list[list[int]]) -> None:
    distinct_prefixes = {tuple(s[:k]) for s in seqs for k in range(1, len(s) + 1)}
    assert repeated_prefix_tokens(seqs) == sum(map(len, seqs)) - len(distinct_prefixes)
