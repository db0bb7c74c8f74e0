"""The pass@1 matrix (harness pool × checkpoint): table text, CSV and PNG, and the eval coordinator's journal
replay and results file."""

from __future__ import annotations

import csv
from pathlib import Path

from harnessrl.runtime.contracts.coordinator import Completion, LeaseRequest, OutcomeKind, PoolScore
from harnessrl.runtime.coordinator.ledger import PoolHarness
from harnessrl.runtime.coordinator.service import commit
from harnessrl.runtime.evaluation.config import EvalConfig
from harnessrl.runtime.evaluation.coordinator import EvalCoordinator, EvalResults
from harnessrl.runtime.evaluation.matrix import build_matrix, format_table, write_csv, write_png


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
    assert "0.250 (1/4)" in lines[2] and "0.750 (3/4)" in lines[2] and lines[2].startswith("oneshot ")
    assert lines[3].startswith("mini-swe-agent (mini)") and "n/a (0/4)" in lines[3] and "0.500 (2/4)" in lines[3]


def test_csv_has_a_row_per_pool_with_values_in_unit_interval(tmp_path: Path) -> None:
    path = tmp_path / "pass_at_1.csv"
    write_csv(build_matrix(RESULTS), path)
    rows = list(csv.DictReader(path.open()))
    assert [r["pool"] for r in rows] == ["oneshot", "mini"]
    assert float(rows[0]["base"]) == 0.25 and float(rows[0]["step-0000010"]) == 0.75
    assert rows[1]["base"] == ""  # nothing scored: blank, never a 0
    assert float(rows[1]["step-0000010"]) == 0.5


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
