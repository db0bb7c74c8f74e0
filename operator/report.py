"""`harnessrl report RUN_DIR`: plots (PNG) and a markdown summary of a run directory.

Reads what the learner wrote: `checkpoints/metrics.jsonl` (one record per step) and
`checkpoints/journal.jsonl` (every accepted rollout completion). Writes `RUN_DIR/report/`:
reward.png (mean reward per step, with a moving average), pass_at_1.png (training pass@1 per harness over
steps), tool_calls.png (tool calls per solved rollout, per harness) and report.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from harnessrl.runtime.learner.journal import JournalEntry
from harnessrl.runtime.learner.metrics import StepMetrics
from harnessrl.runtime.learner.protocol import OutcomeKind
from pydantic import BaseModel


class RunSummary(BaseModel):
    steps: int
    first_reward: float | None  # mean over the first tenth of the steps (at least one)
    last_reward: float | None  # mean over the last tenth
    pass_at_1: dict[str, float]  # last step's training solved rate per harness
    rollouts_scored: int
    rollouts_unscored: int
    rollouts_stale: int
    tool_calls_solved: dict[str, float]  # mean tool calls per solved rollout, per harness


def read_metrics(run_dir: Path) -> list[StepMetrics]:
    path = run_dir / "checkpoints" / "metrics.jsonl"
    if not path.exists():
        return []
    return [StepMetrics.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


def read_completions(run_dir: Path) -> list[JournalEntry]:
    path = run_dir / "checkpoints" / "journal.jsonl"
    if not path.exists():
        return []
    return [JournalEntry.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


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
        if entry.completion.outcome == OutcomeKind.solved:
            calls[entry.harness].append(entry.completion.tool_calls)
    return dict(calls)


def summarize(metrics: list[StepMetrics], tool_calls: dict[str, list[int]]) -> RunSummary:
    rewards = [m.mean_reward for m in metrics if m.mean_reward is not None]
    tenth = max(1, len(rewards) // 10)
    last = metrics[-1] if metrics else None
    return RunSummary(
        steps=last.step if last else 0,
        first_reward=statistics.fmean(rewards[:tenth]) if rewards else None,
        last_reward=statistics.fmean(rewards[-tenth:]) if rewards else None,
        pass_at_1=dict(last.solved_rate_by_harness) if last else {},
        rollouts_scored=last.rollouts_scored if last else 0,
        rollouts_unscored=last.rollouts_unscored if last else 0,
        rollouts_stale=last.rollouts_stale if last else 0,
        tool_calls_solved={h: statistics.fmean(c) for h, c in sorted(tool_calls.items()) if c},
    )


def plot(metrics: list[StepMetrics], tool_calls: dict[str, list[int]], out: Path) -> list[Path]:
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
    harnesses = sorted({h for m in metrics for h in m.solved_rate_by_harness})
    for harness in harnesses:
        points = [(m.step, m.solved_rate_by_harness[harness]) for m in metrics if harness in m.solved_rate_by_harness]
        ax.plot([p[0] for p in points], moving_average([p[1] for p in points], 5), marker=".", label=harness)
    ax.set(xlabel="step", ylabel="pass@1 (training rollouts, 5-step average)", ylim=(-0.05, 1.05),
           title="pass@1 per harness")
    if harnesses:
        ax.legend()
    written.append(_save(fig, out / "pass_at_1.png"))

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

    rows = "\n".join(f"| {h} | {p:.2f} | {fmt(summary.tool_calls_solved.get(h))} |" for h, p in sorted(summary.pass_at_1.items()))
    return f"""# harnessrl run report: {run_dir.name}

- steps: {summary.steps}
- mean reward, first tenth of the steps: {fmt(summary.first_reward)}
- mean reward, last tenth of the steps: {fmt(summary.last_reward)}
- rollouts: {summary.rollouts_scored} scored, {summary.rollouts_unscored} unscored (infrastructure), \
{summary.rollouts_stale} stale

| harness | pass@1 (last step, training) | tool calls per solved rollout |
|---|---|---|
{rows}

![reward](reward.png)

![pass@1](pass_at_1.png)

![tool calls](tool_calls.png)
"""


def write_report(run_dir: Path) -> Path:
    metrics = read_metrics(run_dir)
    if not metrics:
        raise FileNotFoundError(f"no metrics in {run_dir / 'checkpoints' / 'metrics.jsonl'}: has the run taken a step?")
    tool_calls = tool_calls_by_harness(read_completions(run_dir))
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    plot(metrics, tool_calls, out)
    summary = summarize(metrics, tool_calls)
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
