"""The same task side by side: under two harnesses, or sampled by two policy versions (checkpoints).

`GET /compare?task=T&by=harness&a=codex&b=claude-code` (or `by=version&a=0&b=3`): each side has the task's
rollouts under its harness or version, their solved count and mean reward, and one of them shown in full (`ra`,
`rb` pick it; by default the side's best: the highest reward, the earliest of equal ones). Pure: the app renders
what `sides` returns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal
from urllib.parse import urlencode

from harnessrl.runtime.viewer.index import RolloutRow
from harnessrl.runtime.viewer.query import Blank
from pydantic import BaseModel, ConfigDict


class CompareQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: Annotated[str | None, Blank] = None
    by: Literal["harness", "version"] = "harness"
    a: Annotated[str | None, Blank] = None
    b: Annotated[str | None, Blank] = None
    ra: Annotated[str | None, Blank] = None  # the rollout side a shows
    rb: Annotated[str | None, Blank] = None


class Side(BaseModel):
    value: str | None  # its harness or policy version
    rows: list[RolloutRow]  # the task's rollouts under it, in the order they completed
    shown: RolloutRow | None
    solved: int
    scored: int
    mean_reward: float | None


def options(rows: Iterable[RolloutRow], task: str | None, by: str) -> list[str]:
    """The harnesses, or the policy versions, that have a rollout of `task`."""
    if by == "harness":
        return sorted({r.harness for r in rows if r.task_id == task})
    return [str(v) for v in sorted({r.version for r in rows if r.task_id == task and r.version is not None})]


def _of(row: RolloutRow, by: str) -> str | None:
    if by == "harness":
        return row.harness
    return None if row.version is None else str(row.version)


def side(rows: Iterable[RolloutRow], q: CompareQuery, value: str | None, chosen: str | None) -> Side:
    mine = sorted((r for r in rows if r.task_id == q.task and value is not None and _of(r, q.by) == value),
                  key=lambda r: r.seq)
    rewards = [r.reward for r in mine if r.reward is not None]
    shown = next((r for r in mine if r.rollout_id == chosen), None)
    if shown is None and mine:
        shown = min(mine, key=lambda r: (-(r.reward if r.reward is not None else -1.0), r.seq))
    return Side(value=value, rows=mine, shown=shown, solved=sum(r.solved for r in mine),
                scored=sum(r.scored for r in mine), mean_reward=sum(rewards) / len(rewards) if rewards else None)


def sides(rows: list[RolloutRow], q: CompareQuery) -> tuple[CompareQuery, Side, Side]:
    """The query with its blanks filled in (a: the first option, b: the first other one), and its two sides. A
    side that is no option (blank, or a harness's name once `by` became version) is filled in the same way."""
    found = options(rows, q.task, q.by)
    a = q.a if q.a in found else (found[0] if found else None)
    b = q.b if q.b in found else next((v for v in found if v != a), None)
    q = q.model_copy(update={"a": a, "b": b})
    return q, side(rows, q, a, q.ra), side(rows, q, b, q.rb)


def compare_link(q: CompareQuery, **changes: str | None) -> str:
    """The compare page's query string for `q` with `changes`."""
    values = q.model_dump() | changes
    return "?" + urlencode({k: v for k, v in values.items() if v is not None})


def compare_row(row: RolloutRow, by: str) -> str:
    """The compare page for `row`'s task with `row` on side a (under its harness or its policy version)."""
    return compare_link(CompareQuery(task=row.task_id, by="version" if by == "version" else "harness",
                                     a=_of(row, by), ra=row.rollout_id))
