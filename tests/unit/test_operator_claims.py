"""Who holds a checkpoint claim a run names (operator/handlers/claims.py): another live run, by ownerReference,
run-uid label or run label, refuses it; a claim of a gone run, or of nobody, is free."""

from __future__ import annotations

from typing import Any

from harnessrl.operator.handlers.claims import claim_holder

RUNS = [{"metadata": {"name": "run-a", "uid": "uid-a"}}, {"metadata": {"name": "run-b", "uid": "uid-b"}}]


def claim(labels: dict[str, str] | None = None, owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "c", "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "harnessrl.io/v1alpha1", "kind": "TrainingRun", "name": "x",
                                    "uid": owner, "controller": True}]
    return {"metadata": meta}


def test_another_live_runs_claim_is_held_by_it() -> None:
    for held in (claim(owner="uid-a"), claim({"harnessrl.io/run-uid": "uid-a"}), claim({"harnessrl.io/run": "run-a"})):
        assert claim_holder(held, "run-b", "uid-b", RUNS) == "TrainingRun run-a (uid uid-a)", held


def test_a_run_uses_its_own_claim_a_gone_runs_claim_or_a_claim_of_nobody() -> None:
    assert claim_holder(claim({"harnessrl.io/run-uid": "uid-b", "harnessrl.io/run": "run-b"}), "run-b", "uid-b", RUNS) is None
    assert claim_holder(claim({"harnessrl.io/run-uid": "uid-gone", "harnessrl.io/run": "run-z"}), "run-b", "uid-b", RUNS) is None
    assert claim_holder(claim(), "run-b", "uid-b", RUNS) is None
    assert claim_holder(None, "run-b", "uid-b", RUNS) is None
