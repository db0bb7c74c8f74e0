"""Decoding a built-in object as the API server does: against the official OpenAPI schema of the emulated
Kubernetes version (shipped by kubernetes-validate). A value of the wrong type or a malformed quantity is a
decode error (400, Go's `json: cannot unmarshal ...` text); unknown fields are dropped, reported as warnings,
or refused under `fieldValidation=Strict`. Pure."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

import importlib_resources

from .quantity import QuantityError, parse

# The Kubernetes version the emulator reports at /version; its schemas decide what a built-in may hold.
K8S_MINOR = "1.33"
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_GO_TYPES = {"string": "string", "boolean": "bool", "number": "float64", "int32": "int32", "int64": "int64"}


class DecodeError(ValueError):
    """The body cannot be decoded into the kind (the server answers 400 BadRequest)."""


@dataclass
class Decoded:
    obj: dict[str, Any]
    unknown: list[str] = field(default_factory=list)  # paths of dropped unknown fields, as the server names them


def _schema_dir() -> Any:
    return importlib_resources.files("kubernetes_validate").joinpath(f"kubernetes-json-schema/v{K8S_MINOR}.0-local-strict")


@functools.cache
def _definitions() -> dict[str, Any]:
    defs: dict[str, Any] = json.loads(_schema_dir().joinpath("_definitions.json").read_text())["$defs"]
    return defs


@functools.cache
def kind_schema(api_version: str, kind: str) -> dict[str, Any] | None:
    """The top-level schema of a built-in kind, or None when kubernetes-validate has none."""
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    path = _schema_dir().joinpath(f"{kind.lower()}-{group_version}.json")
    schema: dict[str, Any] | None = json.loads(path.read_text()) if path.is_file() else None
    return schema


def _deref(schema: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    ref = schema.get("$ref")
    if not ref:
        return schema, None
    name = ref.rsplit("/", 1)[-1]
    return _definitions()[name], name


def _types(schema: dict[str, Any]) -> set[str]:
    wanted = schema.get("type")
    return set(wanted) if isinstance(wanted, list) else {wanted} if wanted else set()


def _go_type(schema: dict[str, Any]) -> str:
    schema, name = _deref(schema)
    if name:
        return ".".join(name.split(".")[-2:])
    types = _types(schema) - {"null"}
    if "array" in types:
        return "[]" + _go_type(schema.get("items") or {})
    if "object" in types:
        return "map[string]" + _go_type(schema.get("additionalProperties") or {})
    if "integer" in types:
        return _GO_TYPES.get(schema.get("format", "int64"), "int64")
    return _GO_TYPES.get(next(iter(types), "string"), "string")


def _json_kind(value: Any, into_integer: bool) -> str:
    """How Go's UnmarshalTypeError names the JSON value (a number that is no integer shows its text)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, float) and into_integer:
        return f"number {value!r}"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


class _Walker:
    def __init__(self) -> None:
        self.unknown: list[str] = []

    def type_error(self, value: Any, schema: dict[str, Any], struct: str, go_path: str) -> DecodeError:
        into_integer = "integer" in _types(_deref(schema)[0])
        return DecodeError(f"json: cannot unmarshal {_json_kind(value, into_integer)} into Go struct field {struct}.{go_path} "
                           f"of type {_go_type(schema)}")

    def walk(self, schema: dict[str, Any], value: Any, struct: str, go_path: str, path: str) -> Any:
        if value is None:
            return None
        target, name = _deref(schema)
        if name == _QUANTITY:
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise self.type_error(value, schema, struct, go_path)
            try:
                return str(parse(value))  # the server stores (and returns) the canonical form: 0.5 -> "500m"
            except QuantityError as e:
                raise DecodeError(str(e)) from None
        if name == _INT_OR_STRING:
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise self.type_error(value, schema, struct, go_path)
            return value
        types = _types(target)
        if "object" in types or "properties" in target:
            if not isinstance(value, dict):
                raise self.type_error(value, schema, struct, go_path)
            return self._object(target, value, name, struct, go_path, path)
        if "array" in types:
            if not isinstance(value, list):
                raise self.type_error(value, schema, struct, go_path)
            items = target.get("items") or {}
            return [self.walk(items, item, struct, go_path, f"{path}[{n}]") for n, item in enumerate(value)]
        ok = {"string": isinstance(value, str), "boolean": isinstance(value, bool),
              "integer": isinstance(value, int) and not isinstance(value, bool),
              "number": isinstance(value, int | float) and not isinstance(value, bool)}
        if types and not any(ok.get(t, False) for t in types):
            raise self.type_error(value, schema, struct, go_path)
        return value

    def _object(self, schema: dict[str, Any], value: dict[str, Any], name: str | None, struct: str, go_path: str,
                path: str) -> dict[str, Any]:
        properties: dict[str, Any] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        own = name.rsplit(".", 1)[-1] if name else struct
        out: dict[str, Any] = {}
        for key, child in value.items():
            child_go = f"{go_path}.{key}" if go_path else key
            child_path = f"{path}.{key}" if path else key
            if key in properties:
                out[key] = self.walk(properties[key], child, own, child_go, child_path)
            elif isinstance(additional, dict):  # a map: Go's error path names the map, not the key
                out[key] = self.walk(additional, child, own, go_path, child_path)
            elif additional is False and properties:
                self.unknown.append(child_path)
            else:
                out[key] = child  # free-form (RawExtension, JSON)
        return out


def decode(api_version: str, kind: str, obj: dict[str, Any]) -> Decoded | None:
    """`obj` as the server would store it, with the unknown fields it dropped; None for kinds without a schema."""
    schema = kind_schema(api_version, kind)
    if schema is None:
        return None
    walker = _Walker()
    decoded = walker.walk(schema, obj, kind, "", "")
    return Decoded(decoded, walker.unknown)
