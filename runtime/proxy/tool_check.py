"""Harness mismatch: tool calls the harness cannot run. Pure.

A model trained in one harness calls that harness's tools in another (`str_replace_editor` where the harness
offers `edit`), or breaks the argument schema the harness declared; the harness then answers with an error,
and the rollout fails for a reason no grader sees. Each reply's tool calls are checked against the tools the
call offered: a name that is not among them is unknown; arguments that are not a JSON object the tool's
parameter schema accepts are invalid.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from harnessrl.runtime.proxy.dialects.base import FunctionTool
from jsonschema.exceptions import SchemaError, UnknownType
from jsonschema.validators import validator_for
from referencing.exceptions import Unresolvable


@dataclass(frozen=True, slots=True)
class ToolMismatch:
    unknown: int = 0  # calls to a tool the call did not offer
    invalid: int = 0  # calls whose arguments the tool's schema refuses

    def __bool__(self) -> bool:
        return bool(self.unknown or self.invalid)


def check_tool_calls(tools: Sequence[FunctionTool] | None, calls: Iterable[tuple[str, str]]) -> ToolMismatch:
    """The mismatches among `calls` ((name, arguments as JSON text)) against the `tools` offered."""
    offered = {tool.function.name: tool.function.parameters for tool in tools or ()}
    unknown = invalid = 0
    for name, arguments in calls:
        if name not in offered:
            unknown += 1
        elif not _accepts(offered[name], arguments):
            invalid += 1
    return ToolMismatch(unknown, invalid)


def _accepts(schema: dict[str, Any] | None, arguments: str) -> bool:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return False
    if not isinstance(value, dict):
        return False
    if not schema:
        return True
    try:
        validator = validator_for(schema)
        validator.check_schema(schema)
        return bool(validator(schema).is_valid(value))
    except (SchemaError, UnknownType, Unresolvable):  # the harness's own schema is broken: nothing to hold to
        return True
