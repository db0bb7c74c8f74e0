"""The pass@1 matrix (harness pool × checkpoint): table text, CSV and PNG, and the eval coordinator's journal
replay and results file."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from harnessrl.runtime.contracts.coordinator import (
    Completion,
    LeaseRequest,
    OutcomeKind,
    PoolHarness,
    PoolScore,
    wilson_interval,
)
from harnessrl.runtime.coordinator.service import commit
from harnessrl.runtime.evaluation.config import EvalConfig
from harnessrl.runtime.evaluation.coordinator import EvalCoordinator, EvalResults
from harnessrl.runtime.evaluation.matrix import (
    build_matrix,
    format_table,
    write_csv,
    write_png,
)


def score(pool: str, harness: str, solved: int, scored: int, rollouts: int = 4) -> PoolScore:
    return PoolScore(pool=pool, harness=harness, rollouts=rollouts, scored=scored, solved=solved,
                     unscored=rollouts - scored, pending=0, pass_at_1=solved / scored if scored else None,
                     mean_correctness=solved / scored if scored else None)


RESULTS = {
    "base": [score("oneshot", "oneshot", 1, 4), score("mini", "mini-swe-agent", 0, 0)],
    "step-0000010": [score("oneshot", "oneshot", 3, 4), score("mini", "mini-swe-agent", 2, 4)],
}


def test_matrix_rows_are_pools_and_columns_checkpoints_in_order() -> None:
    m = build_matrix(RESULTS)
    assert m.checkpoints == ["base", "step-0000010"]
    assert [(r.pool, r.harness) for r in m.rows] == [("oneshot", "oneshot"), ("mini", "mini-swe-agent")]
    assert [c.pass_at_1 if c else None for c in m.rows[0].cells] == [0.25, 0.75]


def test_table_shows_pass_at_1_with_counts_and_na_for_nothing_scored() -> None:
    text = format_table(build_matrix(RESULTS))
    lines = text.splitlines()
    assert lines[0].split() == ["harness", "(pool)", "base", "step-0000010"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert "0.250 (1/4) [0.05-0.70]" in lines[2] and "0.750 (3/4) [0.30-0.95]" in lines[2]
    assert lines[2].startswith("oneshot ")
    assert lines[3].startswith("mini-swe-agent (mini)") and "n/a (0/4)" in lines[3] and "0.500 (2/4)" in lines[3]


def test_csv_has_a_row_per_pool_with_values_in_unit_interval(tmp_path: Path) -> None:
    path = tmp_path / "pass_at_1.csv"
    write_csv(build_matrix(RESULTS), path)
    rows = list(csv.DictReader(path.open()))
    assert [r["pool"] for r in rows] == ["oneshot", "mini"]
    assert float(rows[0]["base"]) == 0.25 and float(rows[0]["step-0000010"]) == 0.75
    assert rows[1]["base"] == ""  # nothing scored: blank, never a 0
    assert float(rows[1]["step-0000010"]) == 0.5
    # Each cell's 95% interval beside it: around the value, blank where nothing was scored.
    assert float(rows[0]["base lo"]) < 0.25 < float(rows[0]["base hi"])
    assert rows[1]["base lo"] == rows[1]["base hi"] == ""


@pytest.mark.parametrize(("solved", "n", "lo", "hi"), [
    # Reference values of the Wilson score interval at 95% (z = 1.96).
    (0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (5, 10, 0.2366, 0.7634), (1, 4, 0.0456, 0.6994),
])
def test_wilson_interval_matches_reference_values(solved: int, n: int, lo: float, hi: float) -> None:
    got = wilson_interval(solved, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)


def test_wilson_interval_narrows_with_more_attempts_and_holds_the_rate() -> None:
    small, large = wilson_interval(3, 6), wilson_interval(300, 600)
    assert small[0] < large[0] < 0.5 < large[1] < small[1]


def test_a_pool_score_gives_its_interval_and_nan_without_a_scored_attempt() -> None:
    assert score("p", "h", 1, 4).interval() == wilson_interval(1, 4)
    assert all(math.isnan(v) for v in score("p", "h", 0, 0).interval())


def test_png_is_a_real_image(tmp_path: Path) -> None:
    path = tmp_path / "pass_at_1.png"
    write_png(build_matrix(RESULTS), path)
    import matplotlib.image

    image = matplotlib.image.imread(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert image.shape[0] > 200 and image.shape[1] > 300
    assert image[..., :3].std() > 0.05  # not a blank canvas


def config(tmp_path: Path) -> EvalConfig:
    return EvalConfig(label="step-1", pools=[PoolHarness(pool="oneshot", harness="oneshot")], task_ids=["a", "b"],
                      attempts=1, model="tiny-eval-step-1", proxy_url="http://p", journal=tmp_path / "j.jsonl",
                      results=tmp_path / "out" / "results.json", max_unscored=2,
                      runner_token_file=tmp_path / "runner-token")


def test_coordinator_replays_its_journal_after_a_restart_and_writes_results_when_done(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    first = EvalCoordinator(cfg)
    leases = first.lease(LeaseRequest(runner_id="r", pool="oneshot", harness="oneshot", max=2), now=0.0)
    commit(first, first.journal, Completion(rollout_id=leases[0].rollout_id, lease_id=leases[0].lease_id,
                              outcome=OutcomeKind.solved, correctness=1.0), [])
    commit(first, first.journal, Completion(rollout_id=leases[1].rollout_id, lease_id=leases[1].lease_id,
                              outcome=OutcomeKind.infra_error), [])
    first.close()
    assert not cfg.results.exists()
    # A restart loses the leases but not the completions: rollout 0 stays solved, rollout 1 has one failure.
    again = EvalCoordinator(cfg)
    status = again.status()
    assert (status.scored, status.unscored, status.leased) == (1, 0, 0)
    assert again.ledger.slots[leases[1].rollout_id].unscored_failures == 1
    (lease,) = again.lease(LeaseRequest(runner_id="r", pool="oneshot", harness="oneshot", max=5), now=1.0)
    assert lease.rollout_id == leases[1].rollout_id
    commit(again, again.journal, Completion(rollout_id=lease.rollout_id, lease_id=lease.lease_id, outcome=OutcomeKind.wrong), [])
    again.close()
    results = EvalResults.model_validate_json(cfg.results.read_text())
    assert results.done and results.model == "tiny-eval-step-1" and results.tasks == 2
    (pool,) = results.pools
    assert (pool.scored, pool.solved, pool.pass_at_1) == (2, 1, 0.5)
    assert again.done and again.lease(LeaseRequest(runner_id="r", pool="oneshot", harness="oneshot"), now=2.0) == []
