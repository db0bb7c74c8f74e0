"""openAPIV3Schema handling of custom resources: pruning, defaulting and validation (with CEL rules).

Pure functions. Error texts follow the API server's (k8s.io/apiextensions-apiserver) wording so a test can
assert on the message a user would see, e.g.
`spec.grpo.groupSize: Invalid value: 1: spec.grpo.groupSize in body should be greater than or equal to 2`.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from .cel_rules import CelRule, evaluate_rule
from .go_text import go_regexp
from .values import MISSING, shown, type_name

# Root fields every object has; the schema never prunes them (metadata is ObjectMeta, validated apart).
_ROOT_KEPT = ("apiVersion", "kind", "metadata")
_JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def _num(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _type_ok(schema: dict[str, Any], value: Any) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, int | str) and not isinstance(value, bool)
    wanted = schema.get("type")
    if wanted is None:
        return True
    if wanted == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if wanted == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, _JSON_TYPES[wanted])


def prune_and_default(schema: dict[str, Any], value: Any, *, root: bool = False, path: str = "",
                      dropped: list[str] | None = None) -> Any:
    """Drop unknown fields (their paths go to `dropped`) and non-nullable nulls, then fill defaults (the
    server's order). An integral number where an integer is wanted is stored as the integer, as the server
    decodes JSON numbers."""
    if schema.get("type") == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict) and (schema.get("type") == "object" or "properties" in schema
                                    or "additionalProperties" in schema):
        properties: dict[str, Any] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") or additional is True
        embedded = schema.get("x-kubernetes-embedded-resource")
        result: dict[str, Any] = {}
        for key, child in value.items():
            at = f"{path}.{key}" if path else key
            if (root or embedded) and key in _ROOT_KEPT:
                result[key] = child
            elif key in properties:
                if child is None and not properties[key].get("nullable"):
                    continue
                result[key] = prune_and_default(properties[key], child, path=at, dropped=dropped)
            elif isinstance(additional, dict):
                result[key] = prune_and_default(additional, child, path=at, dropped=dropped)
            elif keep_unknown:
                result[key] = child
            elif dropped is not None:
                dropped.append(at)
        for key, child_schema in properties.items():
            if key not in result and "default" in child_schema:
                result[key] = prune_and_default(child_schema, copy.deepcopy(child_schema["default"]))
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_and_default(schema["items"], item, path=f"{path}[{n}]", dropped=dropped) for n, item in enumerate(value)]
    return value


def _cause(field: str, reason: str, message: str) -> dict[str, str]:
    return {"field": field, "reason": reason, "message": message}


def _scalar_causes(schema: dict[str, Any], value: Any, path: str) -> list[dict[str, str]]:
    causes = []
    at = f"{path} in body"
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        causes.append(_cause(path, "FieldValueNotSupported", f"Unsupported value: {shown(value)}: supported values: {allowed}"))
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema:
            exclusive = schema.get("exclusiveMinimum") is True
            if value < schema["minimum"] or (exclusive and value == schema["minimum"]):
                relation = "greater than" if exclusive else "greater than or equal to"
                causes.append(_cause(path, "FieldValueInvalid", f"Invalid value: {shown(value)}: {at} should be {relation} {_num(schema['minimum'])}"))
        if "maximum" in schema:
            exclusive = schema.get("exclusiveMaximum") is True
            if value > schema["maximum"] or (exclusive and value == schema["maximum"]):
                relation = "less than" if exclusive else "less than or equal to"
                causes.append(_cause(path, "FieldValueInvalid", f"Invalid value: {shown(value)}: {at} should be {relation} {_num(schema['maximum'])}"))
        if schema.get("multipleOf") and (value / schema["multipleOf"]) % 1 != 0:
            causes.append(_cause(path, "FieldValueInvalid", f"Invalid value: {shown(value)}: {at} should be a multiple of {_num(schema['multipleOf'])}"))
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            causes.append(_cause(path, "FieldValueInvalid", f"Invalid value: {shown(value)}: {at} should be at least {schema['minLength']} chars long"))
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            causes.append(_cause(path, "FieldValueTooLong", f"Too long: may not be more than {schema['maxLength']} bytes"))
        if "pattern" in schema and go_regexp(schema["pattern"]).search(value) is None:
            causes.append(_cause(path, "FieldValueInvalid", f"Invalid value: {shown(value)}: {at} should match '{schema['pattern']}'"))
    return causes


def _collection_causes(schema: dict[str, Any], value: Any, path: str) -> list[dict[str, str]]:
    causes = []
    at = f"{path} in body"
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            causes.append(_cause(path, "FieldValueInvalid", f"Invalid value: {len(value)}: {at} should have at least {schema['minItems']} items"))
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            causes.append(_cause(path, "FieldValueTooMany", f"Too many: {len(value)}: must have at most {schema['maxItems']} items"))
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "set" or schema.get("uniqueItems"):
            seen: list[Any] = []
            for n, item in enumerate(value):
                if item in seen:
                    causes.append(_cause(f"{path}[{n}]", "FieldValueDuplicate", f"Duplicate value: {shown(item)}"))
                seen.append(item)
        if list_type == "map":
            keys = schema.get("x-kubernetes-list-map-keys") or []
            seen_keys: list[tuple[Any, ...]] = []
            for n, item in enumerate(value):
                key = tuple(item.get(k) for k in keys) if isinstance(item, dict) else (item,)
                if key in seen_keys:
                    shown_key = ", ".join(f'"{k}":{json.dumps(v)}' for k, v in zip(keys, key, strict=False))
                    causes.append(_cause(f"{path}[{n}]", "FieldValueDuplicate", f"Duplicate value: map[string]interface {{}}{{{shown_key}}}"))
                seen_keys.append(key)
    if isinstance(value, dict):
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            causes.append(_cause(path, "FieldValueTooMany", f"Too many: {len(value)}: must have at most {schema['maxProperties']} items"))
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            causes.append(_cause(path, "FieldValueInvalid", f"Invalid value: {len(value)}: {at} should have at least {schema['minProperties']} properties"))
    return causes


def _combinator_causes(schema: dict[str, Any], value: Any, path: str) -> list[dict[str, str]]:
    causes = []
    ok = [not validate(sub, value, path) for sub in schema.get("oneOf") or []]
    if ok and ok.count(True) != 1:
        causes.append(_cause(path, "FieldValueInvalid", f"Invalid value: {shown(value)}: {path} in body must validate one and only one schema (oneOf)"))
    ok = [not validate(sub, value, path) for sub in schema.get("anyOf") or []]
    if ok and not any(ok):
        causes.append(_cause(path, "FieldValueInvalid", f"Invalid value: {shown(value)}: {path} in body must validate at least one schema (anyOf)"))
    for sub in schema.get("allOf") or []:
        causes.extend(validate(sub, value, path))
    if "not" in schema and not validate(schema["not"], value, path):
        causes.append(_cause(path, "FieldValueInvalid", f"Invalid value: {shown(value)}: {path} in body must not validate the schema (not)"))
    return causes


def _child_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _old_item(schema: dict[str, Any], old: Any, item: Any) -> Any:
    """Correlate a list item with its old self: only map-lists have a stable identity (as in Kubernetes)."""
    if schema.get("x-kubernetes-list-type") != "map" or not isinstance(old, list) or not isinstance(item, dict):
        return MISSING
    keys = schema.get("x-kubernetes-list-map-keys") or []
    for candidate in old:
        if isinstance(candidate, dict) and all(candidate.get(k) == item.get(k) for k in keys):
            return candidate
    return MISSING


def validate(schema: dict[str, Any], value: Any, path: str = "", old: Any = MISSING, *, root: bool = False) -> list[dict[str, str]]:
    """All schema and CEL violations of `value` (already pruned and defaulted); `old` enables transition rules."""
    if value is None:
        if schema.get("nullable"):
            return []
        return [_cause(path, "FieldValueInvalid", f"Invalid value: \"null\": {path} in body must be of type {schema.get('type', 'object')}: \"null\"")]
    if not _type_ok(schema, value):
        wanted = "integer or string" if schema.get("x-kubernetes-int-or-string") else schema.get("type")
        given = type_name(value)
        return [_cause(path, "FieldValueTypeInvalid", f'Invalid value: "{given}": {path} in body must be of type {wanted}: "{given}"')]
    causes = _scalar_causes(schema, value, path) + _collection_causes(schema, value, path) + _combinator_causes(schema, value, path)
    if isinstance(value, dict):
        properties: dict[str, Any] = schema.get("properties") or {}
        for key in schema.get("required") or []:
            if key not in value:
                causes.append(_cause(_child_path(path, key), "FieldValueRequired", "Required value"))
        additional = schema.get("additionalProperties")
        for key, child in value.items():
            if root and key in _ROOT_KEPT:
                if key == "metadata" and "metadata" in properties:
                    causes.extend(_metadata_causes(properties["metadata"], child))
                continue
            child_old = old.get(key, MISSING) if isinstance(old, dict) else MISSING
            if key in properties:
                causes.extend(validate(properties[key], child, _child_path(path, key), child_old))
            elif isinstance(additional, dict):
                causes.extend(validate(additional, child, f"{path}[{key}]", child_old))
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for n, item in enumerate(value):
            causes.extend(validate(schema["items"], item, f"{path}[{n}]", _old_item(schema, old, item)))
    if not causes:
        for rule in schema.get("x-kubernetes-validations") or []:
            cause = evaluate_rule(CelRule.model_validate(rule), value, old, path)
            if cause is not None:
                causes.append(cause)
    return causes


def _metadata_causes(schema: dict[str, Any], metadata: Any) -> list[dict[str, str]]:
    """CRD schemas may only constrain metadata.name and metadata.generateName."""
    causes: list[dict[str, str]] = []
    properties = schema.get("properties") or {}
    for key in ("name", "generateName"):
        if key in properties and isinstance(metadata, dict) and key in metadata:
            causes.extend(validate(properties[key], metadata[key], f"metadata.{key}"))
    return causes


def all_rules(schema: Any) -> list[str]:
    """Every CEL rule in a schema (for checking them when the CRD is applied)."""
    if isinstance(schema, list):
        return [r for item in schema for r in all_rules(item)]
    if not isinstance(schema, dict):
        return []
    own = [v["rule"] for v in schema.get("x-kubernetes-validations") or [] if isinstance(v, dict) and "rule" in v]
    return own + [r for key, v in schema.items() if key not in ("x-kubernetes-validations", "default", "enum", "example")
                  for r in all_rules(v)]
