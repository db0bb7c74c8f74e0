"""Checks that a CRD schema is structural (as the API server demands) and bounded (as this project demands).

The API server's rules: every node has a type (unless it is int-or-string or keeps unknown fields);
no $ref; `properties` and `additionalProperties` not both; inside anyOf/allOf/oneOf/not only
value validations (no type, description, default, additionalProperties, nullable); no
`uniqueItems: true`. This project adds: a description on every property, maxLength on every
free string, maxItems on every list, maxProperties on every map, so CEL cost estimates stay bounded.
"""

from __future__ import annotations

from typing import Any

_TYPES = {"object", "array", "string", "integer", "number", "boolean"}
_KEYWORDS = {
    "type", "format", "description", "default", "enum", "nullable", "pattern", "multipleOf",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties", "required",
    "properties", "additionalProperties", "items", "anyOf", "allOf", "oneOf", "not",
    "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type", "x-kubernetes-validations",
}  # fmt: skip
_NOT_IN_JUNCTORS = {"type", "description", "default", "additionalProperties", "nullable"}
INT_OR_STRING_ANY_OF = [{"type": "integer"}, {"type": "string"}]
# The API server validates these itself; CRDs declare them as plain strings.
_SERVER_CHECKED = {"<root>.apiVersion", "<root>.kind"}


def structural_errors(schema: dict[str, Any], path: str = "") -> list[str]:
    """Every way `schema` breaks the rules above, as 'path: problem' lines; [] when it is fine."""
    errors: list[str] = []
    _check(schema, path or "<root>", errors, is_property=False)
    return errors


def _check(node: dict[str, Any], path: str, errors: list[str], *, is_property: bool) -> None:
    def fail(problem: str) -> None:
        errors.append(f"{path}: {problem}")

    if path == "<root>.metadata":
        # The API server forbids anything on metadata but rules on name and generateName.
        if set(node) - {"type", "properties"} or set(node.get("properties", {})) - {"name", "generateName"}:
            fail("may only restrict name and generateName")
        return
    for key in sorted(set(node) - _KEYWORDS):
        fail(f"keyword {key!r} is not allowed in a CRD schema")
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    free_form = node.get("x-kubernetes-preserve-unknown-fields") is True
    kind = node.get("type")
    if kind is None and not (int_or_string or free_form):
        fail("has no type")
    elif kind is not None and kind not in _TYPES:
        fail(f"unknown type {kind!r}")
    if is_property and not node.get("description"):
        fail("has no description")
    if node.get("uniqueItems") is True:
        fail("uniqueItems: true is not allowed (use x-kubernetes-list-type: set)")
    if "properties" in node and "additionalProperties" in node:
        fail("has both properties and additionalProperties")
    for junctor in ("anyOf", "allOf", "oneOf", "not"):
        if junctor not in node:
            continue
        if junctor == "anyOf" and int_or_string and node[junctor] == INT_OR_STRING_ANY_OF:
            continue
        branches = node[junctor] if isinstance(node[junctor], list) else [node[junctor]]
        for branch in branches:
            for key in sorted(_NOT_IN_JUNCTORS & set(branch)):
                fail(f"{junctor} may not set {key!r}")
    if kind == "string" and "maxLength" not in node and "enum" not in node and path not in _SERVER_CHECKED:
        fail("string without maxLength")
    if kind == "array":
        if "maxItems" not in node:
            fail("list without maxItems")
        if isinstance(node.get("items"), dict):
            _check(node["items"], f"{path}[]", errors, is_property=False)
        else:
            fail("list without items")
    if kind == "object":
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            if "maxProperties" not in node:
                fail("map without maxProperties")
            _check(extra, f"{path}{{}}", errors, is_property=False)
        elif extra is not None:
            fail("additionalProperties must be a schema")
        for name, sub in node.get("properties", {}).items():
            _check(sub, f"{path}.{name}", errors, is_property=True)
