"""The run page's plots, drawn by matplotlib as inline SVG (no plotting script to ship to the browser): mean
reward and training solved rate per harness over the learner's steps, and held-out pass@1 per harness pool over
the evaluated steps with its 95% Wilson interval. Every point carries an SVG <title>, which the browser shows on
hover: the exact value (and its interval and counts) a plot only approximates."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harnessrl.runtime.contracts.coordinator import EvalRecord
from harnessrl.runtime.learner.metrics import StepMetrics

SVG_NS = "http://www.w3.org/2000/svg"


def series(metrics: Sequence[StepMetrics], field: str) -> dict[str, tuple[list[int], list[float]]]:
    """harness -> (steps, values) of a per-harness StepMetrics field (mean_reward_by_harness, ...)."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for m in metrics:
        for harness, value in getattr(m, field).items():
            steps, values = out.setdefault(harness, ([], []))
            steps.append(m.step)
            values.append(value)
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Point:
    """One plotted value, its hover text, and its interval if it has one."""

    x: int
    y: float
    title: str
    low: float | None = None
    high: float | None = None


def pass_at_1_points(records: Sequence[EvalRecord]) -> dict[str, list[Point]]:
    """`harness (pool)` -> its held-out pass@1 at each evaluated step, with the 95% Wilson interval."""
    out: dict[str, list[Point]] = {}
    for rec in sorted(records, key=lambda r: r.step):
        for p in rec.pools:
            if p.pass_at_1 is None:
                continue
            lo, hi = p.interval()
            label = p.harness if p.harness == p.pool else f"{p.harness} ({p.pool})"
            out.setdefault(label, []).append(Point(rec.step, p.pass_at_1, f"{label} · step {rec.step} · pass@1 "
                                                   f"{p.pass_at_1:.3f} ({p.solved}/{p.scored}) · 95% [{lo:.3f}, {hi:.3f}]",
                                                   lo, hi))
    return dict(sorted(out.items()))


def _figure(panels: int) -> tuple[Any, list[Any]]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(5 * panels, 3.2), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    for ax in axes:
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    return fig, list(axes)


def _plot(ax: Any, points: dict[str, list[Point]], titles: dict[str, str], prefix: str) -> None:
    """One line per series; each point its own artist with an id, so that its <title> can be put in it."""
    for n, (label, pts) in enumerate(points.items()):
        line = ax.plot([p.x for p in pts], [p.y for p in pts], label=label)[0]
        if any(p.low is not None for p in pts):
            ax.fill_between([p.x for p in pts], [p.low for p in pts], [p.high for p in pts], alpha=0.15,
                            color=line.get_color(), linewidth=0)
        for k, p in enumerate(pts):
            gid = f"{prefix}-{n}-{k}"
            ax.plot([p.x], [p.y], marker="o", markersize=4, color=line.get_color(), gid=gid)
            titles[gid] = p.title
    if points:
        ax.legend(fontsize="small")


def with_titles(svg: str, titles: dict[str, str]) -> str:
    """`svg` with a <title> (the hover text) first in each element whose id `titles` names."""
    ET.register_namespace("", SVG_NS)
    ET.register_namespace("xlink", "http://www.w3.org/1999/xlink")
    root = ET.fromstring(svg)
    for element in root.iter(f"{{{SVG_NS}}}g"):
        if (text := titles.get(element.get("id", ""))) is not None:
            title = ET.Element(f"{{{SVG_NS}}}title")
            title.text = text
            element.insert(0, title)
    return ET.tostring(root, encoding="unicode")


def _svg(fig: Any, titles: dict[str, str]) -> str:
    out = io.StringIO()
    fig.savefig(out, format="svg")
    text = out.getvalue()
    return with_titles(text[text.index("<svg"):], titles)  # inline: without the XML prolog and doctype


def svg(metrics: Sequence[StepMetrics]) -> str:
    """Reward and solved rate per harness over steps, side by side, as an SVG document ("" with no steps)."""
    if not metrics:
        return ""
    fig, axes = _figure(2)
    titles: dict[str, str] = {}
    for ax, (field, label) in zip(axes, [("mean_reward_by_harness", "mean reward"),
                                         ("solved_rate_by_harness", "solved rate")], strict=True):
        points = {h: [Point(s, v, f"{h} · step {s} · {label} {v:.3f}") for s, v in zip(steps, values, strict=True)]
                  for h, (steps, values) in series(metrics, field).items()}
        _plot(ax, points, titles, field)
        ax.set_title(label)
    return _svg(fig, titles)


def pass_at_1_svg(records: Sequence[EvalRecord]) -> str:
    """Held-out pass@1 per harness pool over the evaluated steps, its 95% interval shaded ("" without any)."""
    points = pass_at_1_points(records)
    if not points:
        return ""
    fig, [ax] = _figure(1)
    titles: dict[str, str] = {}
    _plot(ax, points, titles, "pass_at_1")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("held-out pass@1 (95% Wilson interval)")
    return _svg(fig, titles)
