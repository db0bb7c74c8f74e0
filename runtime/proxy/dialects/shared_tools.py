"""One copy per process of each distinct tool list a harness sends.

Every session of a run sends the same tools (a captured Claude Code request carried 30 definitions, tens of KB) on
every call. A session's `ToolsMemo` (base.py) spares it validating and converting them again; this module spares
each session holding its own parsed, validated, converted and encoded copy: sessions whose tools are the same JSON
share one (the session's memo then holds the shared parse, `SeenHistory.adopt`, so its next body's tools are still
known by identity). Both tables are small (a run's harnesses send a handful of distinct tool lists) and start
again when full, so a caller that sends a new tool list on every call cannot grow them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from pydantic import BaseModel
from pydantic_core import to_json

C = TypeVar("C")
_LIMIT = 64

# (the dialect's conversion, the tools' JSON) -> (parsed, validated, converted)
_LISTS: dict[tuple[Callable[..., Any], bytes], tuple[Any, Any, Any]] = {}
# the converted tools' ids -> (those tools, kept alive so that no other object takes their ids; their JSON array)
_JSON: dict[tuple[int, ...], tuple[list[BaseModel], bytes]] = {}


def share(convert: Callable[[Any], C], raw: Any, validated: Any, converted: C) -> tuple[Any, Any, C]:
    """The process's copy of (`raw`, `validated`, `converted`) for tools whose parsed JSON is `raw`: these, the
    first time they are seen."""
    key = (convert, to_json(raw))
    found = _LISTS.get(key)
    if found is None:
        if len(_LISTS) >= _LIMIT:
            _LISTS.clear()
        found = _LISTS[key] = (raw, validated, converted)
    return found[0], found[1], cast(C, found[2])


def tools_json(tools: Sequence[BaseModel]) -> bytes:
    """`tools` as a JSON array (`exclude_none`), encoded once per process for the same tool objects."""
    key = tuple(map(id, tools))
    found = _JSON.get(key)
    if found is None:
        if len(_JSON) >= _LIMIT:
            _JSON.clear()
        encoded = b"[" + b",".join(t.__pydantic_serializer__.to_json(t, exclude_none=True) for t in tools) + b"]"
        found = _JSON[key] = (list(tools), encoded)
    return found[1]
