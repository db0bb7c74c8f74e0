"""A rollout's call graph as the rollout page shows it: how its calls chained into training sequences, and where
and why a call started one more (a prefix break, trajectory/README.md).

The proxy's journal stores each turn as a `TurnDelta` naming its parent, so the chains are read from the deltas
alone. A break's cause is not in the record: the proxy reads it off its prefix tree when the turn arrives, and
linking is deterministic (a restarted proxy replays its journal the same way), so where the session has a break
its turns are replayed into a `SessionGraph`, which reads each cause as the proxy did. A session without a break
costs no replay.

Shown as branches: a branch is a run of turns, each continuing the one before, from its first turn to a leaf,
so each branch is one training sequence. A turn's first child continues its branch; each later child starts a
branch of its own (a break under that turn), and so does each later root (a break with no parent). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harnessrl.runtime.trajectory.graph import SessionGraph
from harnessrl.runtime.trajectory.models import BreakCause, TrainingSequence, TurnDelta
from pydantic import BaseModel


class GraphTurn(BaseModel):
    id: int
    call: int  # the call's place among the session's calls (the rollout page's call list)
    parent: int | None
    new_prompt: int  # prompt tokens beyond the parent's prompt + completion
    sampled: int
    policy_version: int
    cause: BreakCause | None  # set where this turn started one more training sequence


class Branch(BaseModel):
    """Turns from `turns[0]` to a leaf, each continuing the one before: one training sequence."""

    turns: list[int]
    after: int | None  # the turn it continues where it leaves another branch (None: a root)
    cause: BreakCause | None  # why its first turn started a sequence (None: the session's first)
    sequence: int | None  # its index among the rollout's journaled training sequences, if they hold it
    branches: list[Branch] = []  # those leaving it, in the order their first turns came


class CallGraph(BaseModel):
    turns: list[GraphTurn]
    roots: list[Branch]
    breaks: dict[BreakCause, int]  # counted over its turns, as the proxy counted them


def call_graph(records: Sequence[dict[str, Any]], sequences: Sequence[TrainingSequence]) -> CallGraph:
    """`records`: the session's proxy call records in order; `sequences`: its journaled training sequences."""
    deltas = [(i, TurnDelta.model_validate(r["turn"])) for i, r in enumerate(records) if r.get("turn") is not None]
    children: dict[int | None, list[int]] = {}
    for _, d in deltas:
        children.setdefault(d.parent, []).append(d.id)
    breaking = {t for p, kids in children.items() for t in (kids if p is None else kids[1:])} - {0}
    causes: dict[int, BreakCause | None] = {}
    if breaking:
        graph = SessionGraph("viewer")
        for _, d in deltas:
            graph.add_delta(d)
        causes = {t: graph.break_cause(t) for t in breaking}
    turns = [GraphTurn(id=d.id, call=i, parent=d.parent, new_prompt=len(d.prompt_tail), sampled=len(d.completion_ids),
                       policy_version=d.policy_version, cause=causes.get(d.id)) for i, d in deltas]
    leaf_sequence = {s.node_ids[-1]: k for k, s in enumerate(sequences)}

    def branch(first: int, after: int | None) -> Branch:
        run = [first]
        sub: list[tuple[int, int]] = []  # (turn, its later child) for each branch leaving this one
        while kids := children.get(run[-1]):
            sub.extend((run[-1], k) for k in kids[1:])
            run.append(kids[0])
        return Branch(turns=run, after=after, cause=causes.get(first), sequence=leaf_sequence.get(run[-1]),
                      branches=[branch(k, at) for at, k in sorted(sub, key=lambda p: p[1])])

    breaks: dict[BreakCause, int] = {}
    for cause in causes.values():
        if cause is not None:
            breaks[cause] = breaks.get(cause, 0) + 1
    return CallGraph(turns=turns, roots=[branch(r, None) for r in children.get(None, [])], breaks=breaks)
