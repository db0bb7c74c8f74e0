"""How the API server words validation failures: the `field.Error` rendering and the name/label checks of
k8s.io/apimachinery/pkg/util/validation (validation.go) and .../validation/field (errors.go), as texts. Pure."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

_QUALIFIED_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = f"({_QUALIFIED_NAME})?"
_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = _DNS1123_LABEL + r"(\." + _DNS1123_LABEL + ")*"
_CONFIG_KEY = "[-._a-zA-Z0-9]+"


@functools.cache  # patterns repeat (label keys, names, CRD patterns): 66k compiles per 100 runs without it
def go_regexp(pattern: str) -> re.Pattern[str]:
    r"""A Go (RE2) pattern as a Python one: `$` outside a class is the end of the text (Python's `\Z`), never
    "before a trailing newline" as Python's `$` is; a flag group `(?i)` anywhere (RE2 applies it to the rest of
    its group; Python takes global flags only at the start) becomes a scoped `(?i:...)` up to that group's end."""
    out: list[str] = []
    closes = [0]  # per open group: scoped-flag groups to close with it
    in_class, escaped, i = False, False, 0
    while i < len(pattern):
        ch = pattern[i]
        flags = None if escaped or in_class or ch != "(" else re.match(r"\(\?([imsU]+)\)", pattern[i:])
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            out.append(ch)
            escaped = True
        elif in_class:
            out.append(ch)
            in_class = ch != "]"
        elif ch == "[":
            out.append(ch)
            in_class = True
        elif flags is not None:
            out.append(f"(?{flags.group(1).replace('U', '')}:")
            closes[-1] += 1
            i += len(flags.group(0))
            continue
        elif ch == "(":
            out.append(ch)
            closes.append(0)
        elif ch == ")":
            out.append(")" * closes.pop() + ch)
        else:
            out.append(r"\Z" if ch == "$" else ch)
        i += 1
    return re.compile("".join(out) + ")" * closes[0])


def _full(fmt: str) -> re.Pattern[str]:
    return go_regexp(f"^{fmt}$")


def regex_error(msg: str, fmt: str, *examples: str) -> str:
    """validation.RegexError: the message, its examples and the pattern (the doubled spaces are Go's)."""
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    return msg + " (e.g. " + " or ".join(f"'{e}', " for e in examples) + f"regex used for validation is '{fmt}')"


def max_len_error(n: int) -> str:
    return f"must be no more than {n} characters"


def is_dns1123_subdomain(value: str) -> list[str]:
    errs = [max_len_error(253)] if len(value) > 253 else []
    if not _full(_DNS1123_SUBDOMAIN).match(value):
        errs.append(regex_error("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                                "'-' or '.', and must start and end with an alphanumeric character",
                                _DNS1123_SUBDOMAIN, "example.com"))
    return errs


def is_dns1123_label(value: str) -> list[str]:
    errs = [max_len_error(63)] if len(value) > 63 else []
    if not _full(_DNS1123_LABEL).match(value):
        errs.append(regex_error("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
                                "'-', and must start and end with an alphanumeric character",
                                _DNS1123_LABEL, "my-name", "123-abc"))
    return errs


def is_qualified_name(value: str) -> list[str]:
    """validation.IsQualifiedName: label keys, annotation keys, resource names."""
    parts = value.split("/")
    name_msg = regex_error("must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
                           "an alphanumeric character", _QUALIFIED_NAME, "MyName", "my.name", "123-abc")
    if len(parts) > 2:
        return ["a qualified name " + name_msg
                + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    errs: list[str] = []
    name = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in is_dns1123_subdomain(parts[0]))
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part " + max_len_error(63))
    if not _full(_QUALIFIED_NAME).match(name):
        errs.append("name part " + name_msg)
    return errs


def is_valid_label_value(value: str) -> list[str]:
    errs = [max_len_error(63)] if len(value) > 63 else []
    if not _full(_LABEL_VALUE).match(value):
        errs.append(regex_error("a valid label must be an empty string or consist of alphanumeric characters, '-', "
                                "'_' or '.', and must start and end with an alphanumeric character",
                                _LABEL_VALUE, "MyValue", "my_value", "12345"))
    return errs


def is_config_map_key(value: str) -> list[str]:
    errs = [max_len_error(253)] if len(value) > 253 else []
    if not _full(_CONFIG_KEY).match(value):
        errs.append(regex_error("a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                                _CONFIG_KEY, "key.name", "KEY_NAME", "key-name"))
    if value in (".", ".."):
        errs.append(f"must not be '{value}'")
    elif value.startswith(".."):
        errs.append("must not start with '..'")
    return errs


def is_env_var_name(value: str) -> list[str]:
    """RelaxedEnvironmentVariableValidation (on by default since 1.32): printable ASCII other than '='."""
    if value and all(" " <= c <= "~" and c != "=" for c in value):
        return []
    return ["a valid environment variable name must consist only of printable ASCII characters other than '='"]


def go_value(value: Any) -> str:
    """A bad value as field.Error prints it: %v for numbers and booleans, %q for strings, %#v otherwise."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return "map[string]string{" + ", ".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in sorted(value.items())) + "}"
    return json.dumps(value, sort_keys=True)


def invalid(field: str, value: Any, detail: str) -> dict[str, str]:
    return {"field": field, "reason": "FieldValueInvalid", "message": f"Invalid value: {go_value(value)}: {detail}"}


def required(field: str, detail: str = "") -> dict[str, str]:
    return {"field": field, "reason": "FieldValueRequired", "message": "Required value" + (f": {detail}" if detail else "")}


def not_supported(field: str, value: Any, allowed: list[str]) -> dict[str, str]:
    return {"field": field, "reason": "FieldValueNotSupported",
            "message": f"Unsupported value: {go_value(value)}: supported values: " + ", ".join(json.dumps(a) for a in allowed)}
