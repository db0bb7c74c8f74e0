"""Pydantic model -> structural OpenAPI v3 schema, as a CustomResourceDefinition needs it.

Pydantic writes JSON Schema 2020-12 with $refs, anyOf for optionals and numeric exclusive bounds;
the API server wants a structural schema: every node typed, no $ref, unions only in the
int-or-string form, boolean exclusive bounds, no null defaults. Pure functions.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema

# Keys pydantic writes that a CRD schema does not use (or that would break pruning).
_DROPPED = {"title", "propertyNames", "examples"}
INT_OR_STRING = "x-kubernetes-int-or-string"
PRESERVE = "x-kubernetes-preserve-unknown-fields"
RULES = "x-kubernetes-validations"


class SchemaError(ValueError):
    """A model uses a construct the structural schema can't express."""


class _CrdJsonSchema(GenerateJsonSchema):
    """Defaults as the API server should apply them.

    A factory-made sub-object defaults to its *non-default* fields only (usually `{}`), so the
    server then fills in nested defaults itself; empty collections and None get no default.
    """

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            value = factory()  # type: ignore[call-arg]
        else:
            value = schema.get("default", NoDefault)
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        if value is None or (isinstance(value, list | dict) and not value):
            return NoDefault
        return value


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural openAPIV3Schema of `model` (its aliases as property names)."""
    raw = model.model_json_schema(by_alias=True, schema_generator=_CrdJsonSchema)
    defs = raw.pop("$defs", {})
    return _convert(raw, defs, model.__name__)


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline a $ref; keys next to it (a field's description, default, rules) win over the target's."""
    ref = node.get("$ref")
    if ref is None:
        return node
    target = dict(defs[ref.rsplit("/", 1)[-1]])
    siblings = {k: v for k, v in node.items() if k != "$ref"}
    rules = target.get(RULES, []) + siblings.pop(RULES, [])
    merged = {**target, **siblings}
    if rules:
        merged[RULES] = rules
    return _resolve(merged, defs)


def _unwrap_union(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    """Optional[X] becomes X; int | str becomes int-or-string; any other union is refused."""
    options = [_resolve(option, defs) for option in node["anyOf"]]
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    present = [option for option in options if option.get("type") != "null"]
    if len(present) == 1:
        return _resolve({**present[0], **rest}, defs)
    types = {option.get("type") for option in present}
    if types == {"integer", "string"}:
        string = next(option for option in present if option["type"] == "string")
        integer = next(option for option in present if option["type"] == "integer")
        # Both branches' value validations move up: the server applies each to its own type only.
        hoisted = {k: v for k, v in string.items() if k in {"pattern", "maxLength"}}
        hoisted |= {k: v for k, v in integer.items() if k in {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}}
        return {**rest, **hoisted, "anyOf": [{"type": "integer"}, {"type": "string"}], INT_OR_STRING: True}
    raise SchemaError(f"{path}: a union of {sorted(map(str, types))} has no structural form")


def _convert(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    node = _resolve(node, defs)
    if "allOf" in node and len(node["allOf"]) == 1:
        node = _resolve({**node.pop("allOf")[0], **node}, defs)
    if "anyOf" in node and not node.get(INT_OR_STRING):
        node = _unwrap_union(node, defs, path)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key in {"exclusiveMinimum", "exclusiveMaximum"} and not isinstance(value, bool):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        elif key == "properties":
            out[key] = {name: _convert(sub, defs, f"{path}.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs, f"{path}[]")
        elif key == "additionalProperties":
            # False (extra="forbid") needs no keyword: the API server prunes unknown fields.
            if isinstance(value, dict):
                out[key] = _convert(value, defs, f"{path}{{}}")
            elif value is True and not node.get(PRESERVE):
                raise SchemaError(f"{path}: a free-form map must be marked {PRESERVE}")
        else:
            out[key] = value
    if out.get("type") == "string" and out.get("format") == "date-time":
        out.setdefault("maxLength", 64)  # RFC 3339 timestamps; bounded for CEL cost estimates
    if out.get("type") == "string" and "enum" in out:
        out.setdefault("maxLength", max(len(str(v)) for v in out["enum"]))
    if (
        out.get("type") == "object"
        and "properties" in out
        and not out["properties"]
        and not out.get(PRESERVE)
    ):
        del out["properties"]  # an empty object: `type: object` alone prunes every field
    return out
