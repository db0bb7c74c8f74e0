"""`harnessrl report RUN_DIR`: plots (PNG) and a markdown summary of a run directory.

Reads what the learner wrote: `checkpoints/metrics.jsonl` (one record per step), `checkpoints/eval.jsonl` (one
evaluation round per line, when the run has spec.eval), `checkpoints/journal.jsonl` (every accepted rollout
completion) and which `checkpoints/step-N/` dirs exist (it names the best of them by held-out pass@1). Writes
`RUN_DIR/report/`: reward.png (mean reward per step, with a moving average), pass_at_1.png (pass@1 per harness
pool at each evaluated step; without evaluations, the solved rate of the training rollouts per harness over
steps), pass_at_1_matrix.png (the harness × step heatmap of `harnessrl eval`, with evaluations), tool_calls.png
(tool calls per solved rollout, per harness) and report.md (with the run's usage: GPU-seconds, rollouts,
sandbox-seconds, tokens sampled and trained).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Collection
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from harnessrl.operator.api.trainingrun import RunUsage
from harnessrl.runtime.contracts.coordinator import EvalRecord, OutcomeKind, eval_regressions
from harnessrl.runtime.coordinator.journal import JournalEntry, read_entries
from harnessrl.runtime.evaluation.matrix import build_matrix, write_png
from harnessrl.runtime.learner.evaluation import best_round, is_eval_rollout, mean_pass_at_1, read_records
from harnessrl.runtime.learner.metrics import StepMetrics


class RunSummary(BaseModel):
    steps: int
    # Means over the first and the last quarter of the steps (at least one step each): one step is too noisy.
    first_reward: float | None
    last_reward: float | None
    solved_first: dict[str, float]  # training solved rate by harness, first quarter
    solved_last: dict[str, float]  # and last quarter
    # The latest evaluation's pass@1 by pool; without evaluations, the last step's training solved rate by harness.
    pass_at_1: dict[str, float]
    pass_at_1_step: int | None  # the step evaluated (None: training solved rate)
    base_pass_at_1: dict[str, float] = {}  # the base policy's pass@1 by pool (the round at step 0, if any)
    # The checkpoint on disk with the best validation pass@1, or held-out without a validation split (mean over
    # the pools; evaluation.best_round), if any; its held-out pass@1, and the validation pass@1 it was picked by.
    best_step: int | None = None
    best_pass_at_1: float | None = None
    best_validation_pass_at_1: float | None = None
    # The collapse alarm: pools whose latest held-out pass@1 fell well below their best (EvalRegression.describe).
    regressions: list[str] = []
    rollouts_scored: int
    rollouts_unscored: int
    rollouts_stale: int
    tool_calls_solved: dict[str, float]  # mean tool calls per solved rollout, per harness
    # Per harness, over the steps that trained its rollouts: training sequences per rollout (mean of the steps'),
    # and sampled tokens trained (sum).
    sequences_per_rollout: dict[str, float] = {}
    trained_tokens: dict[str, int] = {}
    # Per harness, over the steps: the share of the tokens trained that repeated a prefix another of the step's
    # sequences of the harness had (StepMetrics.repeated_prefix_tokens_by_harness), the cost of not sharing it.
    repeated_prefix_share: dict[str, float] = {}
    # Per harness, over every rollout (training and evaluation): tool calls it could not run, (unknown tool,
    # arguments its schema refused).
    tool_mismatches: dict[str, tuple[int, int]] = {}
    # Per harness, over every rollout: calls that started one more training sequence, by cause (BreakCause).
    prefix_breaks: dict[str, dict[str, int]] = {}
    # What the run consumed (the TrainingRun's status.usage in a cluster); GPU time over the steps' span here.
    usage: RunUsage = RunUsage()


def read_metrics(run_dir: Path) -> list[StepMetrics]:
    path = run_dir / "checkpoints" / "metrics.jsonl"
    if not path.exists():
        return []
    return [StepMetrics.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


def read_completions(run_dir: Path) -> list[JournalEntry]:
    path = run_dir / "checkpoints" / "journal.jsonl"
    if not path.exists():
        return []
    return list(read_entries(path))


def moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def tool_calls_by_harness(entries: list[JournalEntry]) -> dict[str, list[int]]:
    calls: dict[str, list[int]] = defaultdict(list)
    for entry in entries:
        # Evaluation rollouts share the journal; this figure is about the rollouts trained on.
        if entry.completion.outcome == OutcomeKind.solved and not is_eval_rollout(entry.completion.rollout_id):
            calls[entry.harness].append(entry.completion.tool_calls)
    return dict(calls)


def tool_mismatches_by_harness(entries: list[JournalEntry]) -> dict[str, tuple[int, int]]:
    counts: dict[str, tuple[int, int]] = {}
    for entry in entries:
        unknown, invalid = counts.get(entry.harness, (0, 0))
        c = entry.completion
        counts[entry.harness] = (unknown + c.unknown_tool_calls, invalid + c.invalid_tool_calls)
    return dict(sorted(counts.items()))


def prefix_breaks_by_harness(entries: list[JournalEntry]) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for entry in entries:
        counts[entry.harness].update({cause.value: n for cause, n in entry.completion.prefix_breaks.items()})
    return {h: dict(sorted(c.items())) for h, c in sorted(counts.items()) if c}


def plan_gpus(run_dir: Path) -> dict[Literal["learner", "engine"], int]:
    """GPUs of the learner and of all engines, from the plan `harnessrl run` wrote (none without one)."""
    path = run_dir / "plan.json"
    if not path.exists():
        return {}
    plan = json.loads(path.read_text())
    return {"learner": int(plan["learner"]["gpus"]), "engine": int(plan["engine"]["gpus"]) * int(plan["engine"]["replicas"])}


def usage_of(metrics: list[StepMetrics], entries: list[JournalEntry],
             gpus: dict[Literal["learner", "engine"], int]) -> RunUsage:
    """Rollouts, sandbox time and tokens as the learner counts them for status.usage; GPU-seconds as the GPUs
    held over the steps' span (from the first step's start to the last step's end)."""
    span = metrics[-1].time - metrics[0].time + metrics[0].step_s if metrics else 0.0
    timed = [e.completion.timings for e in entries if e.completion.timings is not None]
    return RunUsage(
        gpu_seconds={c: round(n * span, 1) for c, n in gpus.items() if n},
        rollouts=len(entries),
        sandbox_seconds=round(sum(t.seconds for t in timed), 1),
        tokens_sampled=sum(q.num_sampled for e in entries for q in e.sequences),
        tokens_trained=sum(m.tokens for m in metrics),
    )


def read_evals(run_dir: Path) -> list[EvalRecord]:
    return read_records(run_dir / "checkpoints" / "eval.jsonl")


def checkpoint_steps(run_dir: Path) -> set[int]:
    """The steps whose checkpoint is on disk (`checkpoints/step-<N>/`; the learner prunes old ones)."""
    return {int(p.name.removeprefix("step-")) for p in (run_dir / "checkpoints").glob("step-*") if p.is_dir()}


def summarize(metrics: list[StepMetrics], tool_calls: dict[str, list[int]], evals: list[EvalRecord],
              mismatches: dict[str, tuple[int, int]] | None = None,
              breaks: dict[str, dict[str, int]] | None = None, checkpoints: Collection[int] = ()) -> RunSummary:
    rewards = [m.mean_reward for m in metrics if m.mean_reward is not None]
    quarter = max(1, len(metrics) // 4)
    last = metrics[-1] if metrics else None
    latest = evals[-1] if evals else None
    best = best_round(evals, checkpoints)
    return RunSummary(
        steps=last.step if last else 0,
        first_reward=statistics.fmean(rewards[:quarter]) if rewards else None,
        last_reward=statistics.fmean(rewards[-quarter:]) if rewards else None,
        solved_first=solved_rates(metrics[:quarter]),
        solved_last=solved_rates(metrics[-quarter:]),
        pass_at_1=latest.pass_at1() if latest else dict(last.solved_rate_by_harness) if last else {},
        pass_at_1_step=latest.step if latest else None,
        base_pass_at_1=next((e.pass_at1() for e in evals if e.step == 0), {}),
        best_step=best.step if best else None,
        best_pass_at_1=mean_pass_at_1(best) if best else None,
        best_validation_pass_at_1=mean_pass_at_1(best, validation=True) if best else None,
        regressions=[r.describe() for r in eval_regressions(evals)],
        rollouts_scored=last.rollouts_scored if last else 0,
        rollouts_unscored=last.rollouts_unscored if last else 0,
        rollouts_stale=last.rollouts_stale if last else 0,
        tool_calls_solved={h: statistics.fmean(c) for h, c in sorted(tool_calls.items()) if c},
        sequences_per_rollout=_per_harness_mean([m.sequences_per_rollout_by_harness for m in metrics]),
        trained_tokens={h: sum(m.loss_tokens_by_harness.get(h, 0) for m in metrics)
                        for h in sorted({h for m in metrics for h in m.loss_tokens_by_harness})},
        repeated_prefix_share=repeated_prefix_share(metrics),
        tool_mismatches=mismatches or {},
        prefix_breaks=breaks or {},
    )


def repeated_prefix_share(metrics: list[StepMetrics]) -> dict[str, float]:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for m in metrics:
        for h, n in m.tokens_by_harness.items():
            totals[h][0] += m.repeated_prefix_tokens_by_harness.get(h, 0)
            totals[h][1] += n
    return {h: repeated / n for h, (repeated, n) in sorted(totals.items()) if n}


def solved_rates(metrics: list[StepMetrics]) -> dict[str, float]:
    """Each harness's training solved rate, averaged over the steps that consumed rollouts of it."""
    return _per_harness_mean([m.solved_rate_by_harness for m in metrics])


def _per_harness_mean(steps: list[dict[str, float]]) -> dict[str, float]:
    by_harness: dict[str, list[float]] = defaultdict(list)
    for step in steps:
        for harness, value in step.items():
            by_harness[harness].append(value)
    return {h: statistics.fmean(values) for h, values in sorted(by_harness.items())}


def plot(metrics: list[StepMetrics], tool_calls: dict[str, list[int]], evals: list[EvalRecord], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    steps = [m.step for m in metrics if m.mean_reward is not None]
    rewards = [m.mean_reward for m in metrics if m.mean_reward is not None]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, rewards, marker=".", alpha=0.5, label="mean reward")
    if rewards:
        ax.plot(steps, moving_average(rewards, 5), linewidth=2, label="moving average (5 steps)")
    ax.set(xlabel="step", ylabel="reward", title="Mean reward per step")
    ax.legend()
    written.append(_save(fig, out / "reward.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    if evals:
        series = {pool: [(r.step, r.pass_at1()[pool]) for r in evals if pool in r.pass_at1()]
                  for pool in sorted({p for r in evals for p in r.pass_at1()})}
        ylabel, smooth = "pass@1 (held-out evaluation)", 1
    else:  # no evaluation in this run: the training rollouts' solved rate is the closest thing
        series = {h: [(m.step, m.solved_rate_by_harness[h]) for m in metrics if h in m.solved_rate_by_harness]
                  for h in sorted({h for m in metrics for h in m.solved_rate_by_harness})}
        ylabel, smooth = "solved rate (training rollouts, 5-step average)", 5
    for name, points in series.items():
        ax.plot([p[0] for p in points], moving_average([p[1] for p in points], smooth), marker="o" if evals else ".",
                label=name)
    ax.set(xlabel="step", ylabel=ylabel, ylim=(-0.05, 1.05), title="pass@1 per harness")
    if series:
        ax.legend()
    written.append(_save(fig, out / "pass_at_1.png"))
    if evals:
        matrix = build_matrix({f"step {r.step}": r.pools for r in evals})
        write_png(matrix, out / "pass_at_1_matrix.png")
        written.append(out / "pass_at_1_matrix.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    names = sorted(tool_calls)
    if names:
        ax.boxplot([tool_calls[n] for n in names], tick_labels=names)
    ax.set(ylabel="tool calls", title="Tool calls per solved rollout")
    written.append(_save(fig, out / "tool_calls.png"))
    return written


def _save(fig: object, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")  # type: ignore[attr-defined]
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def markdown(run_dir: Path, summary: RunSummary) -> str:
    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    def share(x: float | None) -> str:
        return "-" if x is None else f"{x:.0%}"

    solved = ", ".join(f"{h} {fmt(summary.solved_first.get(h))} → {fmt(r)}" for h, r in summary.solved_last.items())
    lift = ", ".join(f"{p} {fmt(b)} → {fmt(summary.pass_at_1.get(p))}" for p, b in summary.base_pass_at_1.items())
    mismatched = ", ".join(f"{h} {u} / {i}" for h, (u, i) in summary.tool_mismatches.items()) or "-"
    breaks = "; ".join(f"{h} " + ", ".join(f"{cause} {n}" for cause, n in causes.items())
                       for h, causes in summary.prefix_breaks.items()) or "-"
    rows = "\n".join(f"| {h} | {p:.2f} | {fmt(summary.tool_calls_solved.get(h))} | "
                     f"{fmt(summary.sequences_per_rollout.get(h))} | {summary.trained_tokens.get(h, '-')} | "
                     f"{share(summary.repeated_prefix_share.get(h))} |"
                     for h, p in sorted(summary.pass_at_1.items()))
    u = summary.usage
    gpu = ", ".join(f"{c} {s:,.0f}" for c, s in sorted(u.gpu_seconds.items())) or "none (no GPU)"
    usage = (f"GPU-seconds {gpu}; {u.rollouts} rollouts finished, {u.sandbox_seconds:,.0f} sandbox-seconds; "
             f"{u.tokens_sampled:,} tokens sampled (scored rollouts), {u.tokens_trained:,} tokens trained")
    best = ("- (no evaluated checkpoint on disk)" if summary.best_step is None else
            f"step {summary.best_step} (held-out pass@1 {fmt(summary.best_pass_at_1)}, the mean over the eval pools"
            + ("" if summary.best_validation_pass_at_1 is None else
               f"; picked by validation pass@1 {fmt(summary.best_validation_pass_at_1)}") + ")")
    if summary.pass_at_1_step is not None:
        column, matrix = f"pass@1 (evaluation at step {summary.pass_at_1_step})", "\n![pass@1 matrix](pass_at_1_matrix.png)\n"
    else:
        column, matrix = "solved rate (last step, training rollouts)", ""
    return f"""# harnessrl run report: {run_dir.name}

- steps: {summary.steps}
- mean reward, first quarter of the steps: {fmt(summary.first_reward)}
- mean reward, last quarter of the steps: {fmt(summary.last_reward)}
- training solved rate, first → last quarter: {solved}
- held-out pass@1, base policy (step 0) → step {summary.pass_at_1_step}: {lift or "-"}
- best checkpoint: {best}
- collapse alarm (latest validation, else held-out, pass@1 beyond its 95% interval below its best): \
{"; ".join(summary.regressions) or "none"}
- rollouts: {summary.rollouts_scored} scored, {summary.rollouts_unscored} unscored (infrastructure), \
{summary.rollouts_stale} stale
- tool calls the harness could not run (unknown tool / arguments its schema refused): {mismatched}
- calls that started one more training sequence (prefix breaks, by cause): {breaks}
- usage: {usage}

| harness | {column} | tool calls per solved rollout | training sequences per rollout | sampled tokens trained | tokens trained again as a shared prefix |
|---|---|---|---|---|---|
{rows}

![reward](reward.png)

![pass@1](pass_at_1.png)
{matrix}
![tool calls](tool_calls.png)
"""


def write_report(run_dir: Path) -> Path:
    metrics = read_metrics(run_dir)
    if not metrics:
        raise FileNotFoundError(f"no metrics in {run_dir / 'checkpoints' / 'metrics.jsonl'}: has the run taken a step?")
    completions = read_completions(run_dir)
    tool_calls = tool_calls_by_harness(completions)
    evals = read_evals(run_dir)
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    plot(metrics, tool_calls, evals, out)
    summary = summarize(metrics, tool_calls, evals, tool_mismatches_by_harness(completions),
                        prefix_breaks_by_harness(completions), checkpoint_steps(run_dir))
    summary.usage = usage_of(metrics, completions, plan_gpus(run_dir))
    (out / "summary.json").write_text(summary.model_dump_json(indent=2) + "\n")
    report = out / "report.md"
    report.write_text(markdown(run_dir, summary))
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="harnessrl report", description="Plots and a summary of a run directory.")
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        report = write_report(args.run_dir)
    except FileNotFoundError as exc:
        print(f"harnessrl report: {exc}", file=sys.stderr)
        return 2
    print(f"harnessrl: report written to {report}")
    return 0
