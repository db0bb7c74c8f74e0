"""Per-step metrics: one pydantic record, appended as a JSON line and mirrored into Prometheus gauges."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from harnessrl.runtime.learner.coordinator import TrainGroup
from harnessrl.runtime.trajectory.graph import common_prefix_length
from harnessrl.runtime.trajectory.models import TrainingSequence
from prometheus_client import CollectorRegistry, Gauge
from pydantic import BaseModel, Field


class StepMetrics(BaseModel):
    step: int
    policy_version: int
    time: float
    rollouts_scored: int  # cumulative
    rollouts_unscored: int
    rollouts_stale: int
    groups_trained: int
    groups_zero_variance: int
    mean_reward: float | None  # over the rollouts this step consumed
    mean_reward_by_harness: dict[str, float] = Field(default_factory=dict)
    solved_rate_by_harness: dict[str, float] = Field(default_factory=dict)  # training pass@1
    # Of the rollouts trained this step, per harness: training sequences per rollout (1 when every call of a
    # rollout continued the one before; more where the harness rewrote its history), and sampled tokens trained.
    sequences_per_rollout_by_harness: dict[str, float] = Field(default_factory=dict)
    loss_tokens_by_harness: dict[str, int] = Field(default_factory=dict)
    # Of the tokens trained this step, per harness: all, and those that repeat a prefix another sequence of
    # the harness has (the system prompt, tools and task its rollouts share), which packed micro-batches
    # compute again for each sequence and a prefix tree would compute once: what sharing prefixes could save.
    tokens_by_harness: dict[str, int] = Field(default_factory=dict)
    repeated_prefix_tokens_by_harness: dict[str, int] = Field(default_factory=dict)
    # Off-policy data, per harness: rollouts trained this step; of them, those sampled (in part) by an older
    # policy than the one trained, kept and corrected; rollouts dropped past grpo.max_staleness; and loss tokens
    # whose importance weight the band truncated or masked (grpo.vllm_importance_sampling_*).
    rollouts_trained_by_harness: dict[str, int] = Field(default_factory=dict)
    stale_rollouts_kept_by_harness: dict[str, int] = Field(default_factory=dict)
    stale_rollouts_dropped_by_harness: dict[str, int] = Field(default_factory=dict)
    is_truncated_tokens_by_harness: dict[str, int] = Field(default_factory=dict)
    is_masked_tokens_by_harness: dict[str, int] = Field(default_factory=dict)
    loss: float
    clip_fraction: float
    kl: float
    base_kl: float = 0.0  # k3 KL to the base policy (grpo.beta > 0)
    tokens: int
    loss_tokens: int
    tokens_per_s: float
    step_s: float
    sync_s: float
    grad_norm: float


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def captured_by_harness(groups: Sequence[TrainGroup]) -> tuple[dict[str, float], dict[str, int]]:
    """Per harness, over the rollouts of `groups`: training sequences per rollout, and sampled tokens."""
    sequences: dict[str, list[float]] = defaultdict(list)
    tokens: dict[str, int] = defaultdict(int)
    for group in groups:
        for rollout in group.rollouts:
            sequences[group.harness].append(len(rollout.sequences))
            tokens[group.harness] += sum(sum(seq.loss_mask) for seq in rollout.sequences)
    return {h: sum(n) / len(n) for h, n in sequences.items()}, dict(tokens)


def repeated_prefix_tokens(sequences: Sequence[list[int]]) -> int:
    """Tokens of `sequences` a prefix tree would not hold again: the sum of their lengths less the number of
    distinct prefixes. In sorted order each sequence's longest common prefix with any earlier one is the one with
    its neighbour, so that is the sum of neighbours' common prefix lengths."""
    def common(a: list[int], b: list[int]) -> int:
        return common_prefix_length(min(len(a), len(b)), lambda lo, hi: a[lo:hi] == b[lo:hi])

    return sum(common(a, b) for a, b in itertools.pairwise(sorted(sequences)))


def trained_by_harness(trained: Iterable[tuple[str, TrainingSequence]]) -> tuple[dict[str, int], dict[str, int]]:
    """Per harness, over the (harness, sequence) pairs a step trains: tokens, and tokens repeating a prefix."""
    by_harness: dict[str, list[list[int]]] = defaultdict(list)
    for harness, sequence in trained:
        by_harness[harness].append(sequence.token_ids)
    return ({h: sum(map(len, seqs)) for h, seqs in by_harness.items()},
            {h: repeated_prefix_tokens(seqs) for h, seqs in by_harness.items()})


class MetricsSink:
    def __init__(self, path: Path, registry: CollectorRegistry | None = None):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.registry = registry or CollectorRegistry()
        g = lambda name, doc, labels=(): Gauge(f"harnessrl_learner_{name}", doc, labels, registry=self.registry)  # noqa: E731
        self.gauges = {
            "step": g("step", "training steps done"),
            "policy_version": g("policy_version", "policy version served"),
            "rollouts_scored": g("rollouts_scored", "rollouts scored (cumulative)"),
            "rollouts_unscored": g("rollouts_unscored", "rollouts unscored: infra/grader failures (cumulative)"),
            "rollouts_stale": g("rollouts_stale", "rollouts dropped as stale (cumulative)"),
            "groups_zero_variance": g("groups_zero_variance", "groups skipped for zero reward variance"),
            "loss": g("loss", "policy loss of the last step"),
            "clip_fraction": g("clip_fraction", "fraction of loss tokens clipped in the last step"),
            "kl": g("kl", "k3 KL estimate to the behaviour policy, last step"),
            "base_kl": g("base_kl", "k3 KL estimate to the base policy (with grpo.beta), last step"),
            "tokens_per_s": g("tokens_per_s", "trained tokens per second, last step"),
            "sync_s": g("sync_seconds", "weight sync time of the last step"),
        }
        self.reward = g("mean_reward", "mean reward of the rollouts consumed by the last step", ("harness",))
        self.sequences = g("sequences_per_rollout", "training sequences per rollout trained in the last step",
                           ("harness",))
        self.loss_tokens = g("loss_tokens", "sampled tokens trained in the last step", ("harness",))
        self.repeated_prefix = g("repeated_prefix_tokens", "tokens trained in the last step that repeat a prefix "
                                 "another of the harness's sequences already has", ("harness",))
        self.off_policy = {
            "stale_rollouts_kept_by_harness": g("stale_rollouts_kept", "rollouts trained in the last step that an "
                                                "older policy sampled, corrected", ("harness",)),
            "stale_rollouts_dropped_by_harness": g("stale_rollouts_dropped", "rollouts the last step dropped past "
                                                   "grpo.maxStaleness", ("harness",)),
            "is_truncated_tokens_by_harness": g("is_truncated_tokens", "loss tokens of the last step whose "
                                                "importance weight was truncated", ("harness",)),
            "is_masked_tokens_by_harness": g("is_masked_tokens", "loss tokens of the last step whose importance "
                                             "weight was masked to 0", ("harness",)),
        }

    def record(self, m: StepMetrics) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(m.model_dump_json() + "\n")
        for name, gauge in self.gauges.items():
            value = float(getattr(m, name))
            gauge.set(value if math.isfinite(value) else float("nan"))
        for harness, r in m.mean_reward_by_harness.items():
            self.reward.labels(harness=harness).set(r)
        for harness, n in m.sequences_per_rollout_by_harness.items():
            self.sequences.labels(harness=harness).set(n)
        for harness, t in m.loss_tokens_by_harness.items():
            self.loss_tokens.labels(harness=harness).set(t)
        for harness, t in m.repeated_prefix_tokens_by_harness.items():
            self.repeated_prefix.labels(harness=harness).set(t)
        for field, gauge in self.off_policy.items():
            counts = getattr(m, field)
            for harness in {*m.rollouts_trained_by_harness, *counts}:  # a harness trained with none reads 0
                gauge.labels(harness=harness).set(counts.get(harness, 0))

    def history(self) -> list[StepMetrics]:
        if not self.path.exists():
            return []
        return [StepMetrics.model_validate_json(ln) for ln in self.path.read_text().splitlines() if ln.strip()]

    def truncate_to(self, step: int) -> None:
        """Drop records past `step` (written by a run that crashed before checkpointing them)."""
        kept = [m for m in self.history() if m.step <= step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(m.model_dump_json() + "\n" for m in kept))
        tmp.replace(self.path)
