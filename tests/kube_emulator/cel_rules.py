"""`x-kubernetes-validations` CEL rules, evaluated with the `common-expression-language` package."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import cel
from pydantic import BaseModel, ConfigDict, Field

from .values import MISSING, shown

_OLD_SELF = re.compile(r"\boldSelf\b")

# The Kubernetes CEL libraries (strings, lists) that rules commonly use and the base CEL package lacks.
# Quantity, URL, IP, format() and optional-field syntax (`self.?x`) are not provided.
_KUBERNETES_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "lowerAscii": lambda s: s.lower(),
    "upperAscii": lambda s: s.upper(),
    "trim": lambda s: s.strip(),
    "split": lambda s, sep: s.split(sep),
    "join": lambda items, sep="": sep.join(items),
    "replace": lambda s, old, new: s.replace(old, new),
    "indexOf": lambda s, sub: s.find(sub) if isinstance(s, str) else (s.index(sub) if sub in s else -1),
    "lastIndexOf": lambda s, sub: s.rfind(sub) if isinstance(s, str) else (len(s) - 1 - s[::-1].index(sub) if sub in s else -1),
    "isSorted": lambda items: list(items) == sorted(items),
    "sum": lambda items: sum(items),
    "min": lambda items: min(items),
    "max": lambda items: max(items),
}


class CelRule(BaseModel):
    """One entry of x-kubernetes-validations."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    rule: str
    message: str | None = None
    message_expression: str | None = Field(default=None, alias="messageExpression")
    reason: str = "FieldValueInvalid"
    field_path: str | None = Field(default=None, alias="fieldPath")
    optional_old_self: bool = Field(default=False, alias="optionalOldSelf")

    @property
    def is_transition(self) -> bool:
        return bool(_OLD_SELF.search(self.rule))


@functools.lru_cache(maxsize=1024)
def compile_rule(rule: str) -> Any:
    """Compiled program of a rule; raises ValueError with the parser's message when it does not parse."""
    try:
        return cel.compile(rule)
    except Exception as e:  # the binding raises its own error types; the text is what matters
        raise ValueError(f"compilation failed: {e}") from e


def _context(variables: dict[str, Any]) -> cel.Context:
    context = cel.Context()
    for name, fn in _KUBERNETES_FUNCTIONS.items():
        context.add_function(name, fn)
    for name, value in variables.items():
        context.add_variable(name, value)
    return context


def _message(rule: CelRule, context: cel.Context) -> str:
    if rule.message_expression:
        try:
            text = compile_rule(rule.message_expression).execute(context)
            if isinstance(text, str) and text.strip():
                return text
        except Exception:  # the server falls back to `message` when messageExpression fails
            pass
    return rule.message or f"failed rule: {rule.rule}"


def _formatted(reason: str, value_text: str, message: str) -> str:
    if reason == "FieldValueForbidden":
        return f"Forbidden: {message}"
    if reason == "FieldValueRequired":
        return f"Required value: {message}"
    if reason == "FieldValueDuplicate":
        return f"Duplicate value: {value_text}: {message}"
    return f"Invalid value: {value_text}: {message}"


def _evaluation_error(error: Exception) -> str:
    """cel-go's wording for the common runtime error (a field read without has())."""
    return f"no such key: {error.args[0]}" if isinstance(error, KeyError) else str(error)


def evaluate_rule(rule: CelRule, value: Any, old: Any, path: str) -> dict[str, str] | None:
    """None when the rule holds (or does not apply); otherwise the Status cause the server reports."""
    if rule.is_transition and old is MISSING and not rule.optional_old_self:
        return None  # transition rules only run on updates where the old value exists
    variables: dict[str, Any] = {"self": value}
    if rule.is_transition and rule.optional_old_self:  # oldSelf is a CEL optional: oldSelf.hasValue() etc.
        variables["oldSelf"] = cel.OptionalValue.none() if old is MISSING else cel.OptionalValue.of(old)
    elif rule.is_transition:
        variables["oldSelf"] = old
    context = _context(variables)
    field = path
    if rule.field_path:
        field = f"{path}{rule.field_path}" if rule.field_path.startswith(("[", ".")) else f"{path}.{rule.field_path}"
    try:
        ok = compile_rule(rule.rule).execute(context)
    except Exception as e:
        return {"field": field, "reason": "FieldValueInvalid",
                "message": f"Invalid value: {shown(value)}: {_evaluation_error(e)} evaluating rule: {rule.rule}"}
    if ok is True:
        return None
    return {"field": field, "reason": rule.reason, "message": _formatted(rule.reason, shown(value), _message(rule, context))}
