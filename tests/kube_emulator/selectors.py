"""Label and field selectors as the API server parses them (`a=b,c!=d,e in (x,y),f notin (z),g,!h`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from .errors import bad_request

Matcher = Callable[[Mapping[str, Any]], bool]

_SET_TERM = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_EQ_TERM = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")

# Fields the real server indexes for selection; metadata.* works for every kind.
_FIELD_PREFIXES = ("metadata.name", "metadata.namespace", "status.phase", "spec.nodeName", "involvedObject.",
                   "regarding.", "reason", "type")


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside a `(...)` value set."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [t for t in terms if t.strip()]


def _label_term(term: str) -> Callable[[Mapping[str, str]], bool]:
    eq = _EQ_TERM.match(term)
    if eq:
        key, op, value = eq.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    st = _SET_TERM.match(term)
    if st:
        negated, key, op, values_text = st.groups()
        if op is None:
            return (lambda labels: key not in labels) if negated else (lambda labels: key in labels)
        if negated:
            raise bad_request(f"unable to parse requirement: {term!r}")
        values = {v.strip() for v in values_text.split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    raise bad_request(f"unable to parse requirement: found '{term}', expected a label selector term")


def label_matcher(selector: str | None) -> Matcher:
    if not selector:
        return lambda obj: True
    terms = [_label_term(t) for t in _split_terms(selector)]
    return lambda obj: all(t(obj.get("metadata", {}).get("labels") or {}) for t in terms)


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def field_matcher(selector: str | None) -> Matcher:
    if not selector:
        return lambda obj: True
    checks: list[Matcher] = []
    for term in _split_terms(selector):
        eq = _EQ_TERM.match(term)
        if eq is None:
            raise bad_request(f"invalid field selector: {term!r}")
        path, op, value = eq.groups()
        if not path.startswith(_FIELD_PREFIXES):
            raise bad_request(f'field label not supported: "{path}"')
        checks.append(_field_check(path, value, negated=op == "!="))
    return lambda obj: all(check(obj) for check in checks)


def _field_check(path: str, value: str, *, negated: bool) -> Matcher:
    return lambda obj: (_field_value(obj, path) == value) != negated


def selector_string(selector: Mapping[str, Any]) -> str:
    """A LabelSelector object (matchLabels/matchExpressions) as the string form the scale subresource shows."""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op = expr["operator"]
        if op in ("In", "NotIn"):
            parts.append(f"{expr['key']} {op.lower()} ({','.join(expr.get('values') or [])})")
        else:
            parts.append(expr["key"] if op == "Exists" else f"!{expr['key']}")
    return ",".join(parts)
