"""The transfer experiment's summary (examples/transfer/experiment.py): seeds pool into one cell per harness and
setup, the report shows each seed, and the direction is the mean over the harnesses plain-only did not train in."""

from __future__ import annotations

from harnessrl.runtime.contracts.coordinator import PoolScore

from tests.fixtures.transfer import load_experiment


def score(pool: str, solved: int, scored: int = 16) -> PoolScore:
    return PoolScore(pool=pool, harness=pool, rollouts=scored, scored=scored, solved=solved, unscored=0, pending=0,
                     pass_at_1=solved / scored, mean_correctness=None)


def results() -> dict[str, list[PoolScore]]:
    def seed(plain: int, fenced: int, tagged: int) -> list[PoolScore]:
        return [score("plain", plain), score("fenced", fenced), score("tagged", tagged)]

    return {
        "base": seed(4, 1, 1),
        "plain-only-s0": seed(16, 0, 1), "all-s0": seed(15, 14, 12),
        "plain-only-s1": seed(15, 2, 0), "all-s1": seed(16, 8, 4),
    }


def test_seeds_pool_into_one_cell_per_harness_and_setup() -> None:
    exp = load_experiment()
    matrix, summary = exp.summarise(results(), seeds=2, steps=20, attempts=4)
    assert matrix.checkpoints == ["base", "plain-only", "all"]
    fenced = next(r for r in matrix.rows if r.pool == "fenced")
    assert [(c.solved, c.scored) for c in fenced.cells] == [(1, 16), (2, 32), (22, 32)]
    cell = next(c for c in summary.cells if c.pool == "fenced" and c.setup == "all")
    assert cell.per_seed == [14 / 16, 8 / 16] and cell.pass_at_1 == 22 / 32


def test_direction_is_the_mean_over_the_harnesses_not_trained_in() -> None:
    exp = load_experiment()
    _, summary = exp.summarise(results(), seeds=2, steps=20, attempts=4)
    assert summary.transfer["base"] == (1 / 16 + 1 / 16) / 2
    assert summary.transfer["plain-only"] == (2 / 32 + 1 / 32) / 2
    assert summary.transfer["all"] == (22 / 32 + 16 / 32) / 2


def test_report_shows_the_pooled_matrix_each_seed_and_the_command() -> None:
    exp = load_experiment()
    matrix, summary = exp.summarise(results(), seeds=2, steps=20, attempts=4)
    summary.training = [exp.Training(label="plain-only-s0", rollouts_scored=1113, updates=11)]
    text = exp.report(matrix, summary, "make transfer")
    assert "0.688 (22/32) [0.51-0.82]" in text  # fenced, all: pooled with its Wilson interval
    assert "| fenced | 0.00, 0.12 | 0.88, 0.50 |" in text
    assert "plain-only 0.047, all 0.594" in text
    assert "(rollouts scored, policy updates): plain-only-s0 1113, 11" in text
    assert "`make transfer`" in text
