"""The transfer experiment: does training in one harness carry over to the others? (examples/transfer/README.md)

    python examples/transfer/experiment.py --out runs/transfer [--seeds 2] [--steps 20] [--attempts 4]

For each seed, `harnessrl run` trains two adapters from the same base with the same steps, groups and rollouts:
one in the `plain` harness only (plain-only.yaml), one across all three (all.yaml). Then one `harnessrl eval`
scores the base policy and every adapter under all three harnesses on the held-out split. Writes, under --out:
transfer.md (pass@1 pooled over seeds, with 95% Wilson intervals and each seed's value), transfer.png,
transfer.json (the cells and the direction of the effect), and `harnessrl eval`'s own per-seed matrix. Runs and
evaluations already finished under the same --out are reused.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from harnessrl.runtime.contracts.coordinator import PoolScore
from harnessrl.runtime.evaluation.coordinator import EvalResults
from harnessrl.runtime.evaluation.matrix import Matrix, Row, build_matrix, format_table, write_png
from harnessrl.runtime.learner.checkpoint import step_dir_name
from harnessrl.runtime.learner.metrics import StepMetrics
from pydantic import BaseModel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
POOLS = HERE / "harnesses.yaml"
SETUPS = {"plain-only": HERE / "plain-only.yaml", "all": HERE / "all.yaml"}
TRAINED_IN = "plain"  # the harness plain-only trains in; the others are where transfer is measured
BASE = "base"


class Cell(BaseModel):
    """One harness × setup cell: pooled over seeds, and each seed's pass@1."""

    pool: str
    setup: str
    solved: int
    scored: int
    pass_at_1: float | None
    per_seed: list[float | None]


class Training(BaseModel):
    """What one training run consumed: zero-variance groups (all solved or all failed) are drawn again, so a run
    whose harness is solved early scores more rollouts for fewer updates."""

    label: str
    rollouts_scored: int
    updates: int  # policy versions published


class Summary(BaseModel):
    seeds: int
    steps: int
    attempts: int
    cells: list[Cell]
    training: list[Training] = []
    # Mean pass@1 over the harnesses plain-only did not train in, per setup: the effect's direction.
    transfer: dict[str, float]


def label(setup: str, seed: int) -> str:
    return f"{setup}-s{seed}"


def pooled(scores: list[PoolScore]) -> PoolScore:
    """One pool's scores from several evaluations (seeds) as one: counts add up."""
    first = scores[0]
    solved, scored = sum(s.solved for s in scores), sum(s.scored for s in scores)
    return PoolScore(
        pool=first.pool,
        harness=first.harness,
        rollouts=sum(s.rollouts for s in scores),
        scored=scored,
        solved=solved,
        unscored=sum(s.unscored for s in scores),
        pending=sum(s.pending for s in scores),
        pass_at_1=solved / scored if scored else None,
        mean_correctness=None,
    )


def summarise(results: dict[str, list[PoolScore]], seeds: int, steps: int, attempts: int) -> tuple[Matrix, Summary]:
    """`results`: checkpoint label (base, SETUP-sN) -> its pools' scores. The matrix pools each setup's seeds."""
    columns: dict[str, list[PoolScore]] = {BASE: results[BASE]}
    cells: list[Cell] = []
    for setup in SETUPS:
        per_seed = [results[label(setup, s)] for s in range(seeds)]
        columns[setup] = []
        for pool in (p.pool for p in results[BASE]):
            scores = [next(p for p in seed if p.pool == pool) for seed in per_seed]
            total = pooled(scores)
            columns[setup].append(total)
            cells.append(Cell(pool=pool, setup=setup, solved=total.solved, scored=total.scored,
                              pass_at_1=total.pass_at_1, per_seed=[s.pass_at_1 for s in scores]))
    transfer = {}
    for setup in (BASE, *SETUPS):
        others = [p.pass_at_1 or 0.0 for p in columns[setup] if p.pool != TRAINED_IN]
        transfer[setup] = sum(others) / len(others)
    return build_matrix(columns), Summary(seeds=seeds, steps=steps, attempts=attempts, cells=cells, transfer=transfer)


def report(matrix: Matrix, summary: Summary, command: str) -> str:
    def seeds_of(row: Row, setup: str) -> str:
        cell = next(c for c in summary.cells if c.pool == row.pool and c.setup == setup)
        return ", ".join("n/a" if v is None else f"{v:.2f}" for v in cell.per_seed)

    lines = [
        f"pass@1 on the held-out split, {summary.attempts} attempts per task; trained columns pool "
        f"{summary.seeds} seed(s) of {summary.steps} steps (solved/scored, 95% Wilson interval):",
        "",
        "```",
        format_table(matrix),
        "```",
        "",
        "Each seed's pass@1:",
        "",
        "| harness | " + " | ".join(SETUPS) + " |",
        "|---|" + "---|" * len(SETUPS),
        *(f"| {row.pool} | " + " | ".join(seeds_of(row, s) for s in SETUPS) + " |" for row in matrix.rows),
        "",
        "Mean pass@1 over the harnesses plain-only did not train in: "
        + ", ".join(f"{k} {v:.3f}" for k, v in summary.transfer.items()),
        "",
        "Training runs (rollouts scored, policy updates): "
        + ", ".join(f"{t.label} {t.rollouts_scored}, {t.updates}" for t in summary.training),
        "",
        f"Command: `{command}`",
    ]
    return "\n".join(lines) + "\n"


def training(run_dir: Path) -> Training:
    last = StepMetrics.model_validate_json((run_dir / "checkpoints" / "metrics.jsonl").read_text().splitlines()[-1])
    return Training(label=run_dir.name, rollouts_scored=last.rollouts_scored, updates=last.policy_version)


def run(argv: list[str], log: Path) -> None:
    print(f"transfer: harnessrl {' '.join(argv[4:])} (log: {log})", flush=True)
    started = time.monotonic()
    with log.open("w") as fh:
        done = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    if done.returncode != 0:
        raise SystemExit(f"transfer: harnessrl {argv[4]} failed with exit {done.returncode}; see {log}")
    print(f"transfer: done in {time.monotonic() - started:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/transfer"), help="where runs, evaluation and results go")
    parser.add_argument("--seeds", type=int, default=2, help="training seeds per setup")
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps per training run")
    parser.add_argument("--attempts", type=int, default=4, help="evaluation samples per held-out task and harness")
    parser.add_argument("--model", type=Path, default=ROOT / ".cache" / "tiny-model-steerable",
                        help="the base model directory (make transfer builds the tiny model there)")
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    (out / "runs").mkdir(parents=True, exist_ok=True)
    harnessrl = [sys.executable, "-P", "-m", "harnessrl.cli"]
    volumes = ["--volume", f"tiny-model={args.model.resolve()}",
               "--volume", f"transfer-tasks={ROOT / 'examples' / 'quickstart' / 'tasks'}"]
    checkpoints = ["--checkpoint", BASE]
    for seed in range(args.seeds):
        for setup, file in SETUPS.items():
            run_dir = out / "runs" / label(setup, seed)
            checkpoints += ["--checkpoint", f"{label(setup, seed)}={run_dir / 'checkpoints'}"]
            if (run_dir / "checkpoints" / step_dir_name(args.steps)).is_dir():
                print(f"transfer: {label(setup, seed)}: reusing {run_dir}", flush=True)
                continue
            run([*harnessrl, "run", str(POOLS), str(file), "--run-dir", str(run_dir), "--seed", str(seed),
                 "--steps", str(args.steps), "--no-live", *volumes], out / f"train-{label(setup, seed)}.log")
    run([*harnessrl, "eval", str(POOLS), str(SETUPS["all"]), *checkpoints, "--attempts", str(args.attempts),
         "--out", str(out), *volumes], out / "eval.log")
    results = {
        r.label: r.pools
        for r in (EvalResults.model_validate_json((out / "eval" / c.split("=")[0] / "results.json").read_text())
                  for c in checkpoints[1::2])
    }
    matrix, summary = summarise(results, args.seeds, args.steps, args.attempts)
    summary.training = [training(out / "runs" / label(setup, seed)) for seed in range(args.seeds) for setup in SETUPS]
    command = f"make transfer  # experiment.py --seeds {args.seeds} --steps {args.steps} --attempts {args.attempts}"
    (out / "transfer.md").write_text(report(matrix, summary, command))
    (out / "transfer.json").write_text(summary.model_dump_json(indent=2) + "\n")
    write_png(matrix, out / "transfer.png")
    print((out / "transfer.md").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
