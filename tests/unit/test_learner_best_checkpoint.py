"""The best checkpoint by held-out pass@1 (evaluation.best_round): the one the Hub's main branch holds, the report
names and the checkpoint rotation keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harnessrl.runtime.contracts.coordinator import EvalRecord, PoolScore
from harnessrl.runtime.learner.checkpoint import take_snapshot, write_checkpoint
from harnessrl.runtime.learner.coordinator import CoordinatorState
from harnessrl.runtime.learner.evaluation import best_round, mean_pass_at_1


def round_at(step: int, **solved: int | None) -> EvalRecord:
    """A round with 4 attempts per pool; None: the pool's attempts all went unscored."""
    pools = [PoolScore(pool=p, harness=p, rollouts=4, scored=0 if n is None else 4, solved=n or 0,
                       unscored=4 if n is None else 0, pending=0, pass_at_1=None if n is None else n / 4,
                       mean_correctness=None if n is None else n / 4)
             for p, n in solved.items()]
    return EvalRecord(step=step, policy_version=step, model=f"m-v{step}", time=0.0, tasks=4, attempts=1, pools=pools)


def step_of(r: EvalRecord | None) -> int | None:
    return None if r is None else r.step


def test_the_best_is_the_highest_mean_over_the_pools_of_a_checkpoint_that_exists() -> None:
    rounds = [round_at(0, a=4, b=4), round_at(2, a=4, b=0), round_at(4, a=3, b=2), round_at(6, a=4, b=4)]
    # The base policy's round has no checkpoint; step 6's was never written: neither counts.
    assert step_of(best_round(rounds, {2, 4})) == 4  # a mean of 0.625 beats a single pool's 1.00
    assert mean_pass_at_1(rounds[2]) == 0.625
    assert step_of(best_round(rounds, {2, 4, 6})) == 6


def test_ties_go_to_the_earlier_step() -> None:
    rounds = [round_at(4, a=2, b=2), round_at(2, a=3, b=1), round_at(6, a=1, b=3)]
    assert step_of(best_round(rounds, {2, 4, 6})) == 2


def test_a_collapse_after_the_best_keeps_the_best() -> None:
    rounds = [round_at(0, a=1), round_at(2, a=3), round_at(4, a=4), round_at(6, a=0), round_at(8, a=1)]
    assert step_of(best_round(rounds, {2, 4, 6, 8})) == 4


def test_no_evaluation_or_nothing_scored_names_no_best() -> None:
    assert best_round([], {2, 4}) is None
    assert best_round([round_at(2, a=4)], set()) is None
    # A pool without a scored attempt is left out of the mean; a round with none is no candidate.
    assert step_of(best_round([round_at(2, a=3, b=None), round_at(4, a=None, b=None)], {2, 4})) == 2
    assert mean_pass_at_1(round_at(4, a=None)) is None


class Policy:
    """What write_checkpoint needs of a model: somewhere to write its weights."""

    def save_pretrained(self, path: Path, state_dict: dict[str, Any]) -> None:
        path.mkdir(parents=True)


def test_the_rotation_keeps_the_best_checkpoint_beside_the_newest(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    rounds = [round_at(2, a=1), round_at(4, a=4), round_at(6, a=0)]

    def save(step: int, evals: list[EvalRecord]) -> list[str]:
        snapshot = take_snapshot(CoordinatorState(step=step, policy_version=step), {}, {}, metrics, evals)
        write_checkpoint(tmp_path / "ck", Policy(), snapshot, "lora", keep=2)
        return sorted(p.name for p in (tmp_path / "ck").glob("step-*"))

    assert save(2, []) == ["step-0000002"]
    assert save(4, rounds[:1]) == ["step-0000002", "step-0000004"]
    assert save(6, rounds[:2]) == ["step-0000004", "step-0000006"]
    assert save(8, rounds) == ["step-0000004", "step-0000006", "step-0000008"]  # step 4, the best, stays
    assert save(10, []) == ["step-0000008", "step-0000010"]  # without evaluations: the newest only
