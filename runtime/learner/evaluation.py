"""Evaluation rounds inside training (TrainingRun spec.eval): pass@1 of the current policy under each eval pool.

Before the first step (unless `at_start` is off: the base policy's baseline), at every `every_steps`-th step,
and after the last one, the coordinator opens a round: the eval ledger of
runtime/coordinator/ledger.py (task × pool × attempt) for the policy version just published. Its rollouts are
leased to the pools' runners through the same `POST /v1/leases`, ahead of training rollouts, marked
`training=False`; their completions go to the ledger, never to GRPO groups (no sequences are fetched).

Training pauses while a round is open: no step is taken, so the whole round samples one policy version and
pass@1 belongs to exactly that step. Runners keep collecting training rollouts meanwhile (for the same version,
so nothing goes stale), up to the coordinator's window of open groups. A round is part of the coordinator's
state, so a checkpoint holds it and the journal replays its completions after a restart.

Pure except `EvalLog`, which appends the finished rounds to eval.jsonl.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Collection, Sequence
from pathlib import Path

from harnessrl.runtime.contracts.coordinator import (
    EvalProgress,
    EvalRecord,
    EvalRegression,
    PoolScore,
    eval_regressions,
)
from harnessrl.runtime.contracts.learner_config import EvalSchedule
from harnessrl.runtime.coordinator import ledger as L
from prometheus_client import CollectorRegistry, Gauge
from pydantic import BaseModel

# Every eval rollout id starts with this; training rollout ids start with "g".
EVAL_PREFIX = "eval-"


class EvalRound(BaseModel):
    step: int
    policy_version: int
    model: str
    prefix: str  # of its rollout ids: a round opened again after a restart has a new one
    tasks: int
    attempts: int
    ledger: L.Ledger  # of the eval split's tasks and the validation split's
    validation: list[str] = []  # the validation split's task ids


def is_eval_rollout(rollout_id: str) -> bool:
    return rollout_id.startswith(EVAL_PREFIX)


def due(schedule: EvalSchedule, step: int, last_step: int) -> bool:
    return step % schedule.every_steps == 0 or step >= last_step


def open_round(schedule: EvalSchedule, task_ids: list[str], step: int, policy_version: int, model: str) -> EvalRound:
    """A round over `task_ids` and, in the same ledger, the schedule's validation tasks."""
    # The nonce keeps completions of a round lost in a crash (leased before the restart) out of its successor.
    prefix = f"{EVAL_PREFIX}s{step}-{secrets.token_hex(3)}/"
    validation = schedule.validation_task_ids()
    return EvalRound(
        step=step,
        policy_version=policy_version,
        model=model,
        prefix=prefix,
        tasks=len(task_ids),
        attempts=schedule.attempts,
        ledger=L.plan_ledger(schedule.pools, task_ids + validation, schedule.attempts, prefix),
        validation=validation,
    )


def pools_of(r: EvalRound) -> dict[str, str]:
    """pool -> harness of the round."""
    return {s.pool: s.harness for s in r.ledger.slots.values()}


def progress(r: EvalRound) -> EvalProgress:
    slots = r.ledger.slots.values()
    return EvalProgress(
        step=r.step,
        policy_version=r.policy_version,
        rollouts=len(slots),
        finished=sum(s.status in L.FINAL for s in slots),
    )


def record(r: EvalRound, now: float) -> EvalRecord:
    """The round's scores, the eval split's and the validation split's apart."""
    validation = set(r.validation)
    held_out = {k: s for k, s in r.ledger.slots.items() if s.task_id not in validation}
    chosen_on = {k: s for k, s in r.ledger.slots.items() if s.task_id in validation}
    return EvalRecord(
        step=r.step,
        policy_version=r.policy_version,
        model=r.model,
        time=now,
        tasks=r.tasks,
        attempts=r.attempts,
        pools=L.pool_scores(L.Ledger(slots=held_out)),
        validation=L.pool_scores(L.Ledger(slots=chosen_on)) if chosen_on else [],
    )


def mean_pass_at_1(r: EvalRecord, *, validation: bool = False) -> float | None:
    """The round's held-out pass@1 (`validation`: the validation split's) averaged over its pools (each harness
    counts once); None when no pool scored."""
    return _mean(r.validation if validation else r.pools)


def _mean(scores: Sequence[PoolScore]) -> float | None:
    scored = [s.pass_at_1 for s in scores if s.pass_at_1 is not None]
    return math.fsum(scored) / len(scored) if scored else None


def best_round(rounds: Sequence[EvalRecord], steps: Collection[int]) -> EvalRecord | None:
    """The round of the best checkpoint: the highest mean pass@1 on the validation split (the held-out split
    without one: `EvalRecord.selection`) among the rounds at `steps` (the checkpoints that exist, so never the
    base policy's round); of equal ones, the earliest. None when no such round scored anything: then the newest
    checkpoint stands in."""
    scored = [(m, r) for r in rounds if r.step in steps and (m := _mean(r.selection())) is not None]
    return max(scored, key=lambda mr: (mr[0], -mr[1].step))[1] if scored else None


def read_records(path: Path) -> list[EvalRecord]:
    if not path.exists():
        return []
    return [EvalRecord.model_validate_json(ln) for ln in path.read_text().splitlines() if ln.strip()]


class EvalLog:
    """eval.jsonl (one EvalRecord per round, by step) and a pass@1 gauge per pool."""

    def __init__(self, path: Path, registry: CollectorRegistry) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.gauge = Gauge("harnessrl_learner_eval_pass_at_1", "pass@1 of the latest evaluation", ("pool",),
                           registry=registry)

    def record(self, rec: EvalRecord) -> list[EvalRegression]:
        """Append the round; the pools whose pass@1 it shows fallen well below their best (the collapse alarm)."""
        # A round replayed after a restart replaces its earlier line instead of adding a second one.
        records = [r for r in read_records(self.path) if r.step != rec.step] + [rec]
        self._rewrite(records)
        for p in rec.pools:
            self.gauge.labels(pool=p.pool).set(math.nan if p.pass_at_1 is None else p.pass_at_1)
        return eval_regressions(records)

    def truncate_to(self, step: int) -> None:
        """Drop rounds past `step` (a resumed run evaluates those steps again)."""
        if self.path.exists():
            self._rewrite([r for r in read_records(self.path) if r.step <= step])

    def _rewrite(self, records: list[EvalRecord]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(r.model_dump_json() + "\n" for r in records))
        tmp.replace(self.path)
