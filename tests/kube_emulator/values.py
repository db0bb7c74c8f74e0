"""Small helpers over JSON values shared by schema and CEL validation."""

from __future__ import annotations

import json
from typing import Any

# The absence of an old value (a create, or a field that did not exist before the update).
MISSING: Any = object()


def type_name(value: Any) -> str:
    """The OpenAPI type name of a JSON value."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def shown(value: Any) -> str:
    """How a value appears in `Invalid value: ...` (Go's %v of scalars, the type name of composites)."""
    if isinstance(value, dict | list):
        return json.dumps(type_name(value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value)


def clone(value: Any) -> Any:
    """A deep copy of a JSON value (a JSON round trip is several times faster than copy.deepcopy)."""
    return json.loads(json.dumps(value))
