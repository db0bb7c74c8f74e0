"""The run page's plots: mean reward and training solved rate per harness over the learner's steps, drawn by
matplotlib as inline SVG (no plotting script to ship to the browser)."""

from __future__ import annotations

import io
from collections.abc import Sequence

from harnessrl.runtime.learner.metrics import StepMetrics


def series(metrics: Sequence[StepMetrics], field: str) -> dict[str, tuple[list[int], list[float]]]:
    """harness -> (steps, values) of a per-harness StepMetrics field (mean_reward_by_harness, ...)."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for m in metrics:
        for harness, value in getattr(m, field).items():
            steps, values = out.setdefault(harness, ([], []))
            steps.append(m.step)
            values.append(value)
    return dict(sorted(out.items()))


def svg(metrics: Sequence[StepMetrics]) -> str:
    """Reward and solved rate per harness over steps, side by side, as an SVG document ("" with no steps)."""
    if not metrics:
        return ""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(10, 3.2), layout="constrained")
    for ax, (field, label) in zip(fig.subplots(1, 2), [("mean_reward_by_harness", "mean reward"),
                                                       ("solved_rate_by_harness", "solved rate")], strict=True):
        for harness, (steps, values) in series(metrics, field).items():
            ax.plot(steps, values, marker="o", markersize=3, label=harness)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    out = io.StringIO()
    fig.savefig(out, format="svg")
    text = out.getvalue()
    return text[text.index("<svg"):]  # inline: without the XML prolog and doctype
