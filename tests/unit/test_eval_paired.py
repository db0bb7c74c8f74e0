"""Paired comparison of checkpoints on the same tasks: the exact McNemar test, which pairs count, the change in tool
calls where both solved, and how `harnessrl eval` prints and writes it."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from harnessrl.runtime.contracts.coordinator import OutcomeKind
from harnessrl.runtime.coordinator import ledger as L
from harnessrl.runtime.evaluation.coordinator import EvalResults
from harnessrl.runtime.evaluation.matrix import build_matrix, format_paired, write_paired_csv
from harnessrl.runtime.evaluation.paired import compare, mcnemar_p, paired_comparisons

from harnessrl.local.evaluate import write_report


@pytest.mark.parametrize(("gained", "lost", "p"), [
    # By hand: p = min(1, 2 · sum_{k <= min(b, c)} C(b + c, k) / 2^(b + c)).
    (8, 1, 20 / 512),  # 2 · (1 + 9) / 2^9 = 0.0390625
    (1, 8, 20 / 512),  # two-sided: symmetric
    (0, 6, 2 / 64),  # 0.03125
    (10, 2, 2 * (1 + 12 + 66) / 4096),  # 0.0385742
    (0, 0, 1.0),  # no discordant pair: no evidence either way
    (5, 5, 1.0),  # 2 · 638/1024 > 1: capped
    (1, 0, 1.0),
])
def test_mcnemar_p_matches_hand_computed_values(gained: int, lost: int, p: float) -> None:
    assert mcnemar_p(gained, lost) == pytest.approx(p, rel=1e-12)


def test_mcnemar_p_is_the_binomial_tail_by_definition() -> None:
    tail = sum(math.comb(42, k) for k in range(13))
    assert mcnemar_p(30, 12) == pytest.approx(2 * tail / 2**42, rel=1e-12)


def test_mcnemar_p_stays_a_probability_at_large_counts() -> None:
    assert 0.0 < mcnemar_p(3000, 2600) < 1e-6
    assert mcnemar_p(4000, 4000) == 1.0


def slot(pool: str, task: str, outcome: OutcomeKind | None, tool_calls: int = 0, attempt: int = 0) -> L.Slot:
    """A slot scored with `outcome`, or unscored for good when `outcome` is an infra error, or still pending (None)."""
    status = (L.SlotStatus.pending if outcome is None
              else L.SlotStatus.unscored if outcome == OutcomeKind.infra_error else L.SlotStatus.scored)
    return L.Slot(rollout_id=L.rollout_id(pool, task, attempt), pool=pool, harness=f"{pool}-cli", task_id=task,
                  attempt=attempt, status=status, outcome=outcome, tool_calls=tool_calls)


SOLVED, WRONG, INFRA = OutcomeKind.solved, OutcomeKind.wrong, OutcomeKind.infra_error


def test_only_pairs_scored_under_both_count() -> None:
    base = [slot("p", "a", WRONG), slot("p", "b", WRONG), slot("p", "c", INFRA), slot("p", "d", SOLVED),
            slot("p", "e", SOLVED), slot("p", "a", SOLVED, attempt=1)]
    later = [slot("p", "a", SOLVED), slot("p", "b", None), slot("p", "c", SOLVED), slot("p", "d", WRONG),
             slot("p", "e", SOLVED), slot("p", "a", WRONG, attempt=1)]
    (c,) = compare("base", base, "step-10", later)
    # b: pending later, c: unscored in base: neither is a pair. Attempts pair with the same attempt only.
    assert (c.pool, c.harness, c.reference, c.checkpoint) == ("p", "p-cli", "base", "step-10")
    assert (c.pairs, c.gained, c.lost, c.both_solved) == (4, 1, 2, 1)
    assert c.p_value == 1.0


def test_tool_calls_are_compared_only_where_both_solved() -> None:
    base = [slot("p", "a", SOLVED, 12), slot("p", "b", SOLVED, 8), slot("p", "c", SOLVED, 50), slot("p", "d", WRONG, 1)]
    later = [slot("p", "a", SOLVED, 9), slot("p", "b", SOLVED, 5), slot("p", "c", WRONG, 1), slot("p", "d", SOLVED, 90)]
    (c,) = compare("base", base, "step-10", later)
    assert (c.both_solved, c.reference_tool_calls, c.tool_calls) == (2, 10.0, 7.0)
    assert c.tool_call_change == pytest.approx(-0.3)


def test_no_tool_call_change_without_a_pair_both_solved_or_from_zero() -> None:
    (none,) = compare("base", [slot("p", "a", SOLVED, 4)], "s", [slot("p", "a", WRONG, 4)])
    assert (none.reference_tool_calls, none.tool_calls, none.tool_call_change) == (None, None, None)
    (zero,) = compare("base", [slot("p", "a", SOLVED, 0)], "s", [slot("p", "a", SOLVED, 3)])
    assert (zero.reference_tool_calls, zero.tool_calls, zero.tool_call_change) == (0.0, 3.0, None)


def test_each_later_checkpoint_is_compared_with_the_first_in_each_pool_evaluated_by_both() -> None:
    runs = {
        "base": [slot("p", "a", WRONG), slot("q", "a", WRONG)],
        "step-10": [slot("p", "a", SOLVED), slot("q", "a", None)],
        "step-20": [slot("p", "a", WRONG)],  # pool q not evaluated here
    }
    got = [(c.reference, c.checkpoint, c.pool, c.pairs, c.gained) for c in paired_comparisons(runs)]
    assert got == [("base", "step-10", "p", 1, 1), ("base", "step-10", "q", 0, 0), ("base", "step-20", "p", 1, 0)]
    assert paired_comparisons({"base": runs["base"]}) == []


def results(label: str, slots: list[L.Slot]) -> EvalResults:
    ledger = L.Ledger(slots={s.rollout_id: s for s in slots})
    return EvalResults(label=label, done=True, rollouts=len(slots), leased=0, scored=len(slots), unscored=0,
                       leases_expired=0, duplicates=0, pools=L.pool_scores(ledger), model="m", policy_version=0,
                       attempts=1, tasks=len(slots), slots=slots)


# Nine tasks where the later checkpoint solves 8 more and loses 1 (p = 0.0391), plus two both solve with fewer calls.
BASE = [slot("p", f"t{i}", WRONG) for i in range(8)] + [slot("p", "t8", SOLVED, 3)] + [
    slot("p", "u0", SOLVED, 12), slot("p", "u1", SOLVED, 8)]
LATER = [slot("p", f"t{i}", SOLVED, 4) for i in range(8)] + [slot("p", "t8", WRONG)] + [
    slot("p", "u0", SOLVED, 9), slot("p", "u1", SOLVED, 5)]


def test_the_paired_section_reads_gains_losses_p_and_tool_calls() -> None:
    runs = {"base": results("base", BASE), "step-10": results("step-10", LATER)}
    m = build_matrix({label: r.pools for label, r in runs.items()})
    text = format_paired(m, paired_comparisons({label: r.slots for label, r in runs.items()}))
    assert text.startswith("paired vs base:")
    head, rule, row = text.splitlines()[-3:]
    assert head.split() == ["harness", "(pool)", "step-10"] and set(rule.replace(" ", "")) == {"-"}
    assert row.startswith("p-cli (p)") and row.endswith("+8/-1 of 11, p=0.039; tool calls 10.0→7.0 (-30%, n=2)")


def test_eval_prints_and_writes_the_paired_section(tmp_path: Path) -> None:
    runs = {"base": results("base", BASE), "step-10": results("step-10", LATER)}
    report = write_report(runs, tmp_path, "11 test tasks", 1)
    assert report.startswith("pass@1 on 11 test tasks, 1 attempt(s) each")
    assert "\npaired vs base:" in report and "+8/-1 of 11, p=0.039" in report
    assert (tmp_path / "pass_at_1.txt").read_text() == report
    assert (tmp_path / "pass_at_1.csv").exists() and (tmp_path / "pass_at_1.png").exists()
    (row,) = csv.DictReader((tmp_path / "paired.csv").open())
    assert (row["pool"], row["reference"], row["checkpoint"], row["gained"], row["lost"]) == ("p", "base", "step-10", "8", "1")
    assert float(row["p_value"]) == pytest.approx(0.0390625, rel=1e-5)
    assert float(row["tool_call_change"]) == pytest.approx(-0.3)


def test_a_single_checkpoint_has_no_paired_section_and_an_empty_paired_csv(tmp_path: Path) -> None:
    report = write_report({"base": results("base", BASE)}, tmp_path, "11 test tasks", 1)
    assert "paired" not in report
    assert (tmp_path / "paired.csv").read_text().splitlines() == [",".join([
        "pool", "harness", "reference", "checkpoint", "pairs", "gained", "lost", "p_value", "both_solved",
        "reference_tool_calls", "tool_calls", "tool_call_change"])]


def test_paired_csv_leaves_missing_values_blank(tmp_path: Path) -> None:
    comparisons = compare("base", [slot("p", "a", WRONG)], "s", [slot("p", "a", WRONG)])
    write_paired_csv(comparisons, tmp_path / "paired.csv")
    (row,) = csv.DictReader((tmp_path / "paired.csv").open())
    assert row["p_value"] == "1" and row["reference_tool_calls"] == row["tool_calls"] == row["tool_call_change"] == ""
