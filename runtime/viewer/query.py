"""The rollout list's filters, order and page (the list page's form and the JSON API take the same query), and
the pure function that applies them to the index's rows."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlencode

from harnessrl.runtime.viewer.index import RolloutRow
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _blank_is_none(value: Any) -> Any:
    """An HTML form sends a filter left at "any" as an empty value."""
    return None if value == "" else value


Blank = BeforeValidator(_blank_is_none)
SortKey = Literal["seq", "harness", "task_id", "outcome", "reward", "advantage", "tool_calls", "version"]
SORTABLE: tuple[str, ...] = get_args(SortKey)


class RolloutQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    harness: Annotated[str | None, Blank] = None
    task: Annotated[str | None, Blank] = None
    solved: Annotated[bool | None, Blank] = None
    version: Annotated[int | None, Blank] = None
    evaluation: Annotated[bool | None, Blank] = None
    sort: SortKey = "seq"
    order: Literal["asc", "desc"] = "asc"
    page: int = Field(1, ge=1)
    per_page: int = Field(50, ge=1, le=500)


class RolloutPage(BaseModel):
    total: int  # rows matching the filters
    page: int
    pages: int
    per_page: int
    rows: list[RolloutRow]


def matches(row: RolloutRow, q: RolloutQuery) -> bool:
    return ((q.harness is None or row.harness == q.harness) and (q.task is None or row.task_id == q.task)
            and (q.solved is None or row.solved == q.solved) and (q.version is None or row.version == q.version)
            and (q.evaluation is None or row.evaluation == q.evaluation))


def select(rows: Iterable[RolloutRow], q: RolloutQuery) -> RolloutPage:
    """The rows matching `q`, ordered by its column (rows without a value last either way), one page of them."""
    found = [r for r in rows if matches(r, q)]
    with_value = [r for r in found if getattr(r, q.sort) is not None]
    without = [r for r in found if getattr(r, q.sort) is None]
    with_value.sort(key=lambda r: (getattr(r, q.sort), r.seq), reverse=q.order == "desc")
    ordered = with_value + without
    pages = max(1, -(-len(ordered) // q.per_page))
    start = (q.page - 1) * q.per_page
    return RolloutPage(total=len(ordered), page=q.page, pages=pages, per_page=q.per_page,
                       rows=ordered[start:start + q.per_page])


def link(q: RolloutQuery, **changes: Any) -> str:
    """The list's query string for `q` with `changes` (a filter or the order changed: back to page 1)."""
    if "page" not in changes:
        changes["page"] = 1
    values = q.model_dump() | changes
    return "?" + urlencode({k: str(v).lower() if isinstance(v, bool) else v for k, v in values.items() if v is not None})
