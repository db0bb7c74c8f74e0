"""An honest checkpoint choice (TrainingRun spec.eval.validationSplit): each round scores a validation split beside
the held-out test split, the best checkpoint is picked and the collapse alarm raised on validation, and the model
card and report give the chosen checkpoint's test pass@1."""

from __future__ import annotations

from harnessrl.runtime.contracts.coordinator import EvalRecord, PoolHarness, eval_regressions
from harnessrl.runtime.contracts.learner_config import EvalSchedule, TaskSource
from harnessrl.runtime.learner.evaluation import best_round, is_eval_rollout, mean_pass_at_1, record
from harnessrl.runtime.learner.hub import why_main

from tests.unit.test_learner_best_checkpoint import round_at
from tests.unit.test_learner_eval_round import PA, SCHEDULE, finish, make, steps


def with_validation(step: int, test: int, validation: int) -> EvalRecord:
    """A one-pool round: `test` and `validation` of 4 attempts solved."""
    return round_at(step, a=test).model_copy(update={"validation": round_at(step, a=validation).pools})


def test_a_round_scores_the_validation_tasks_apart_from_the_held_out_ones() -> None:
    schedule = SCHEDULE.model_copy(update={"pools": SCHEDULE.pools[:1], "validation": TaskSource(ids=["v0", "v1"])})
    c = make(steps=2, schedule=schedule)
    steps(c, 2)
    solved = {"e0": "solved", "e1": "wrong", "v0": "wrong", "v1": "wrong"}
    leased = [le for le in c.lease(PA, now=0) if is_eval_rollout(le.rollout_id)]
    assert sorted(le.task_id for le in leased) == ["e0", "e1", "v0", "v1"]
    for le in leased:
        c.complete(finish(rollout_id=le.rollout_id, lease_id=le.lease_id, outcome=solved[le.task_id]), [])
    rec = c.close_eval(now=5)
    assert rec is not None and rec.tasks == 2
    assert rec.pass_at1() == {"pa": 0.5}  # the held-out split alone
    assert [(p.pool, p.scored, p.pass_at_1) for p in rec.validation] == [("pa", 2, 0.0)]


def test_without_a_validation_split_a_round_records_none() -> None:
    schedule = EvalSchedule(pools=[PoolHarness(pool="pa", harness="mini")], tasks=TaskSource(ids=["x"]))
    assert schedule.validation_task_ids() == []
    c = make(steps=2)
    steps(c, 2)
    assert c.state.eval_round is not None and record(c.state.eval_round, 0.0).validation == []


def test_the_best_checkpoint_is_picked_on_validation_not_on_the_split_it_is_reported_on() -> None:
    # Step 4 peaks on the test split by chance; step 2 is the better checkpoint on validation.
    rounds = [with_validation(0, 1, 1), with_validation(2, 2, 4), with_validation(4, 4, 2)]
    best = best_round(rounds, {2, 4})
    assert best is not None and best.step == 2
    assert (mean_pass_at_1(best), mean_pass_at_1(best, validation=True)) == (0.5, 1.0)
    # Without validation scores the held-out split picks, as before.
    assert best_round([round_at(2, a=2), round_at(4, a=4)], {2, 4}).step == 4  # type: ignore[union-attr]


def test_the_collapse_alarm_reads_the_validation_split() -> None:
    # Validation falls from 4/4 to 0/4 while the test split holds: the alarm rings.
    (regression,) = eval_regressions([with_validation(2, 2, 4), with_validation(4, 2, 0)])
    assert (regression.best_step, regression.best_pass_at_1, regression.pass_at_1) == (2, 1.0, 0.0)
    # The test split falling while validation holds is no alarm.
    assert eval_regressions([with_validation(2, 4, 2), with_validation(4, 0, 2)]) == []


def test_the_model_card_gives_the_chosen_checkpoints_test_pass_at_1() -> None:
    text = "\n".join(why_main(with_validation(2, 2, 4), with_validation(4, 4, 2), "step-"))
    assert "best by validation pass@1" in text and "1.0000" in text
    assert "held-out test split, which played no part in the choice, it scores 0.50 (a 0.50)" in text
