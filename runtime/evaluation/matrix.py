"""The matrix the field reports: pass@1 per harness pool (rows) × checkpoint (columns), as text, CSV and PNG.

Pure builders plus two small writers. A cell with no scored attempt has no value: blank in the CSV, "n/a" in the
table, and a grey cell in the heatmap, never a 0 that would read as "always wrong".
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from harnessrl.runtime.contracts.coordinator import PoolScore, wilson_interval
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
    return (math.nan, math.nan) if cell is None or cell.pass_at_1 is None else wilson_interval(cell.solved, cell.scored)


def _value(cell: PoolScore | None) -> float:
    """pass@1, NaN where there is none (NaN is what matplotlib masks)."""
    return math.nan if cell is None or cell.pass_at_1 is None else cell.pass_at_1


def format_table(m: Matrix) -> str:
    """A fixed-width table: pass@1 with solved/scored counts and its 95% interval, e.g. `0.500 (4/8) [0.22-0.78]`."""

    def cell(c: PoolScore | None) -> str:
        if c is None or c.pass_at_1 is None:
            return "n/a" if c is None else f"n/a (0/{c.rollouts})"
        lo, hi = _interval(c)
        return f"{c.pass_at_1:.3f} ({c.solved}/{c.scored}) [{lo:.2f}-{hi:.2f}]"

    head = ["harness (pool)", *m.checkpoints]
    body = [[f"{r.harness} ({r.pool})" if r.harness != r.pool else r.pool, *map(cell, r.cells)] for r in m.rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


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
