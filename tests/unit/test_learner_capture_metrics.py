"""Step metrics of what the proxy captured: training sequences per rollout and sampled tokens, per harness."""

from __future__ import annotations

from pathlib import Path

from harnessrl.runtime.learner.coordinator import TrainGroup, TrainRollout
from harnessrl.runtime.learner.metrics import MetricsSink, StepMetrics, captured_by_harness
from harnessrl.runtime.trajectory.models import TrainingSequence
from prometheus_client import generate_latest


def sequence(loss_tokens: int) -> TrainingSequence:
    n = 2 + loss_tokens
    return TrainingSequence(session_id="s", node_ids=[0], token_ids=list(range(n)), loss_mask=[0, 0] + [1] * loss_tokens,
                            logprobs=[0.0, 0.0] + [-1.0] * loss_tokens, policy_versions=[0] * n)


def group(harness: str, *rollouts: list[int]) -> TrainGroup:
    return TrainGroup(group_id=f"g-{harness}", task_id="t", harness=harness, rollouts=[
        TrainRollout(rollout_id=f"{harness}-{i}", reward=0.0, advantage=0.0, sequences=[sequence(n) for n in seqs])
        for i, seqs in enumerate(rollouts)])


def test_sequences_per_rollout_and_tokens_per_harness_reach_the_step_record_and_prometheus(tmp_path: Path) -> None:
    # Claude Code split one rollout into three sequences; OpenCode kept each rollout in one.
    groups = [group("claude-code", [5, 4, 3], [6]), group("opencode", [7], [2])]
    per_rollout, tokens = captured_by_harness(groups)
    assert per_rollout == {"claude-code": 2.0, "opencode": 1.0}
    assert tokens == {"claude-code": 18, "opencode": 9}
    sink = MetricsSink(tmp_path / "metrics.jsonl")
    sink.record(StepMetrics(
        step=1, policy_version=1, time=0.0, rollouts_scored=4, rollouts_unscored=0, rollouts_stale=0, groups_trained=2,
        groups_zero_variance=0, mean_reward=0.5, loss=0.0, clip_fraction=0.0, kl=0.0, tokens=40, loss_tokens=27,
        tokens_per_s=1.0, step_s=1.0, sync_s=0.0, grad_norm=0.0, sequences_per_rollout_by_harness=per_rollout,
        loss_tokens_by_harness=tokens))
    assert sink.history()[0].sequences_per_rollout_by_harness == per_rollout
    exposed = generate_latest(sink.registry).decode()
    assert 'harnessrl_learner_sequences_per_rollout{harness="claude-code"} 2.0' in exposed
    assert 'harnessrl_learner_loss_tokens{harness="opencode"} 9.0' in exposed
