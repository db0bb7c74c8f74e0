"""Whether a run may use the checkpoint claim its spec names (`spec.learner.checkpointClaimName`): not when
another live run holds it, or the run would resume from that run's checkpoints and prune them. Pure.

A run holds a claim through its controller ownerReference (its own claim under checkpointRetention Delete), its
`harnessrl.io/run-uid` label (its own retained claim), or its `harnessrl.io/run` label (its other volumes). A
claim of a run that is gone, or one no run holds (made by hand), is free to use: that is how a run resumes from
a deleted run's retained checkpoints."""

from __future__ import annotations

from typing import Any

from harnessrl.operator.api.common import RUN_LABEL, RUN_UID_LABEL
from harnessrl.operator.api.trainingrun import KIND

Manifest = dict[str, Any]


def claim_holder(claim: Manifest | None, run: str, run_uid: str, runs: list[Manifest]) -> str | None:
    """The other live run (of `runs`, the namespace's TrainingRuns) that holds `claim`, described; None when
    `run` may use it."""
    if claim is None:
        return None
    live = {str(r["metadata"]["uid"]): str(r["metadata"]["name"]) for r in runs}
    meta = claim["metadata"]
    labels = meta.get("labels") or {}
    holders = [str(ref["uid"]) for ref in meta.get("ownerReferences") or [] if ref.get("kind") == KIND]
    if labels.get(RUN_UID_LABEL):
        holders.append(str(labels[RUN_UID_LABEL]))
    holders += [uid for uid, name in live.items() if name == labels.get(RUN_LABEL)]
    other = next((uid for uid in holders if uid != run_uid and uid in live and live[uid] != run), None)
    if other is None:
        return None
    return f"TrainingRun {live[other]} (uid {other})"
