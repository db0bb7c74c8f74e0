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
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from referencing.exceptions import Unresolvable


@dataclass(frozen=True, slots=True)
class ToolMismatch:
    unknown: int = 0  # calls to a tool the call did not offer
    invalid: int = 0  # calls whose arguments the tool's schema refuses

    def __bool__(self) -> bool:
        return bool(self.unknown or self.invalid)


class ToolValidators:
    """Holds a session's tool calls to the tools each call offered, with each argument schema compiled (and
    checked against its metaschema) once: a session's canonical tools are the very objects its previous call had
    (`ToolsMemo`) while they do not change, so schemas are known by identity. Compiling on every call cost ~1.3 ms
    for one small schema, more than the rest of the proxy's work on a call. One per session."""

    __slots__ = ("_compiled",)
    LIMIT = 256  # schemas kept; a session whose tools keep changing starts over

    def __init__(self) -> None:
        # id(schema) -> (the schema, kept so its id stays its own; its validator, None when it is broken)
        self._compiled: dict[int, tuple[dict[str, Any], Validator | None]] = {}

    def check(self, tools: Sequence[FunctionTool] | None, calls: Iterable[tuple[str, str]]) -> ToolMismatch:
        """The mismatches among `calls` ((name, arguments as JSON text)) against the `tools` offered."""
        offered = {tool.function.name: tool.function.parameters for tool in tools or ()}
        unknown = invalid = 0
        for name, arguments in calls:
            if name not in offered:
                unknown += 1
            elif not self._accepts(offered[name], arguments):
                invalid += 1
        return ToolMismatch(unknown, invalid)

    def _accepts(self, schema: dict[str, Any] | None, arguments: str) -> bool:
        try:
            value = json.loads(arguments or "{}")
        except ValueError:
            return False
        if not isinstance(value, dict):
            return False
        validator = self._validator(schema) if schema else None
        try:
            return validator is None or bool(validator.is_valid(value))
        except (UnknownType, Unresolvable):  # the harness's own schema is broken: nothing to hold the call to
            return True

    def _validator(self, schema: dict[str, Any]) -> Validator | None:
        known = self._compiled.get(id(schema))
        if known is not None and known[0] is schema:
            return known[1]
        if len(self._compiled) >= self.LIMIT:
            self._compiled.clear()
        cls = validator_for(schema)
        try:
            cls.check_schema(schema)
            validator: Validator | None = cls(schema)
        except SchemaError:
            validator = None
        self._compiled[id(schema)] = (schema, validator)
        return validator
