"""The matrix the field reports: pass@1 per harness pool (rows) × checkpoint (columns), as text, CSV and PNG, and
each later checkpoint's paired comparison with the first (runtime/evaluation/paired.py) as text and CSV.

Pure builders plus small writers. A cell with no scored attempt has no value: blank in the CSV, "n/a" in the
table, and a grey cell in the heatmap, never a 0 that would read as "always wrong".
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from harnessrl.runtime.contracts.coordinator import PoolScore
from harnessrl.runtime.evaluation.paired import Comparison
from pydantic import BaseModel


class Row(BaseModel):
    pool: str
    harness: str
    cells: list[PoolScore | None]  # one per checkpoint, None when the pool was not evaluated there


class Matrix(BaseModel):
    checkpoints: list[str]
    rows: list[Row]


def build_matrix(results: dict[str, list[PoolScore]]) -> Matrix:
    """`results` maps checkpoint label (in column order) -> its pools' scores."""
    labels = list(results)
    pools: dict[str, str] = {}
    for scores in results.values():
        for s in scores:
            pools.setdefault(s.pool, s.harness)
    rows = []
    for pool, harness in pools.items():
        cells = [next((s for s in results[label] if s.pool == pool), None) for label in labels]
        rows.append(Row(pool=pool, harness=harness, cells=cells))
    return Matrix(checkpoints=labels, rows=rows)


def _interval(cell: PoolScore | None) -> tuple[float, float]:
    return (math.nan, math.nan) if cell is None else cell.interval()


def _value(cell: PoolScore | None) -> float:
    """pass@1, NaN where there is none (NaN is what matplotlib masks)."""
    return math.nan if cell is None or cell.pass_at_1 is None else cell.pass_at_1


def _pool_label(r: Row) -> str:
    return f"{r.harness} ({r.pool})" if r.harness != r.pool else r.pool


def _layout(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_table(m: Matrix) -> str:
    """A fixed-width table: pass@1 with solved/scored counts and its 95% interval, e.g. `0.500 (4/8) [0.22-0.78]`."""

    def cell(c: PoolScore | None) -> str:
        if c is None or c.pass_at_1 is None:
            return "n/a" if c is None else f"n/a (0/{c.rollouts})"
        lo, hi = _interval(c)
        return f"{c.pass_at_1:.3f} ({c.solved}/{c.scored}) [{lo:.2f}-{hi:.2f}]"

    return _layout(["harness (pool)", *m.checkpoints], [[_pool_label(r), *map(cell, r.cells)] for r in m.rows])


def format_paired(m: Matrix, comparisons: list[Comparison]) -> str:
    """The matrix's later checkpoints against its first, a cell each, e.g.
    `+8/-1 of 20, p=0.039; tool calls 12.0→8.3 (-31%, n=7)`."""
    reference = m.checkpoints[0]
    found = {(c.pool, c.checkpoint): c for c in comparisons}

    def cell(c: Comparison | None) -> str:
        if c is None or c.pairs == 0:
            return "n/a"
        p = "p<0.001" if c.p_value < 0.001 else f"p={c.p_value:.3f}"
        tools = "n/a"
        if c.reference_tool_calls is not None and c.tool_calls is not None:
            change = "" if c.tool_call_change is None else f"{c.tool_call_change:+.0%}, "
            tools = f"{c.reference_tool_calls:.1f}→{c.tool_calls:.1f} ({change}n={c.both_solved})"
        return f"+{c.gained}/-{c.lost} of {c.pairs}, {p}; tool calls {tools}"

    later = m.checkpoints[1:]
    body = [[_pool_label(r), *(cell(found.get((r.pool, label))) for label in later)] for r in m.rows]
    return (f"paired vs {reference}: +solved by the checkpoint only/-by {reference} only, of the (task, attempt) "
            f"pairs scored under both;\nexact McNemar p; tool calls: mean where both solved (n pairs), "
            f"{reference}→checkpoint\n" + _layout(["harness (pool)", *later], body))


def write_csv(m: Matrix, path: Path) -> None:
    """One row per pool: `pool,harness,<checkpoint>...` with pass@1 in [0, 1], then `<checkpoint> lo` and
    `<checkpoint> hi`, its 95% Wilson interval, for each checkpoint (blank: nothing scored)."""

    def number(v: float) -> str:
        return "" if math.isnan(v) else f"{v:.6f}"

    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        bounds = [f"{label} {end}" for label in m.checkpoints for end in ("lo", "hi")]
        out.writerow(["pool", "harness", *m.checkpoints, *bounds])
        for r in m.rows:
            intervals = [number(v) for c in r.cells for v in _interval(c)]
            out.writerow([r.pool, r.harness, *(number(_value(c)) for c in r.cells), *intervals])


def write_paired_csv(comparisons: list[Comparison], path: Path) -> None:
    """One row per pool × later checkpoint: the Comparison's fields and `tool_call_change` (blank: no value).
    Only the header with a single checkpoint, so no comparison from an earlier run in the same place survives."""
    fields = [*Comparison.model_fields, "tool_call_change"]
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(fields)
        for c in comparisons:
            values = [*c.model_dump().values(), c.tool_call_change]
            out.writerow(["" if v is None else f"{v:.6g}" if isinstance(v, float) else v for v in values])


def write_png(m: Matrix, path: Path) -> None:
    """A heatmap (rows: harness pools, columns: checkpoints), each cell annotated with its pass@1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    values = np.array([[_value(c) for c in r.cells] for r in m.rows], dtype=float)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.4 * len(m.checkpoints) + 3), max(2.5, 0.6 * len(m.rows) + 1.5)))
    try:
        image = ax.imshow(np.ma.masked_invalid(values), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_facecolor("#dddddd")
        ax.set_xticks(range(len(m.checkpoints)), m.checkpoints, rotation=30, ha="right")
        ax.set_yticks(range(len(m.rows)), [r.pool for r in m.rows])
        for i, row in enumerate(values):
            for j, v in enumerate(row):
                text = "n/a" if math.isnan(v) else f"{v:.2f}"
                ax.text(j, i, text, ha="center", va="center", color="white" if not math.isnan(v) and v < 0.6 else "black")
        ax.set_xlabel("checkpoint")
        ax.set_ylabel("harness pool")
        ax.set_title("pass@1 by harness × checkpoint")
        fig.colorbar(image, ax=ax, label="pass@1")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
