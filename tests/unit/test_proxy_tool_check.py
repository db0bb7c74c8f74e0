"""Harness mismatch: a reply's tool calls held to the tools the call offered (runtime/proxy/tool_check.py)."""

from __future__ import annotations

import pytest
from harnessrl.runtime.proxy.dialects.base import FunctionDefinition, FunctionTool
from harnessrl.runtime.proxy.tool_check import ToolMismatch, ToolValidators

BASH = FunctionTool(function=FunctionDefinition(name="bash", parameters={
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"],
    "additionalProperties": False}))
TODO = FunctionTool(function=FunctionDefinition(name="todo"))  # no schema: any JSON object
BROKEN = FunctionTool(function=FunctionDefinition(name="broken", parameters={"type": "no-such-type"}))


def test_calls_the_harness_can_run_are_no_mismatch() -> None:
    calls = [("bash", '{"command": "ls"}'), ("todo", '{"items": [1]}'), ("todo", "")]
    assert ToolValidators().check([BASH, TODO], calls) == ToolMismatch()
    assert not ToolValidators().check([BASH, TODO], calls)


def test_a_tool_the_call_did_not_offer_is_unknown() -> None:
    # Another harness's editor, and any tool at all when the call offered none.
    assert ToolValidators().check([BASH], [("str_replace_editor", '{"path": "a"}')]) == ToolMismatch(unknown=1)
    assert ToolValidators().check(None, [("bash", '{"command": "ls"}')]) == ToolMismatch(unknown=1)


def test_arguments_the_schema_refuses_are_invalid() -> None:
    calls = [
        ("bash", '{"cmd": "ls"}'),  # required property missing, unknown one given
        ("bash", '{"command": 3}'),  # wrong type
        ("bash", '{"command": "ls"'),  # not JSON
        ("todo", '["a list"]'),  # not an object
    ]
    assert ToolValidators().check([BASH, TODO], calls) == ToolMismatch(invalid=4)


def test_a_broken_schema_holds_no_call_to_it() -> None:
    assert ToolValidators().check([BROKEN], [("broken", '{"x": 1}')]) == ToolMismatch()


def test_each_schema_is_compiled_once_per_session(monkeypatch: pytest.MonkeyPatch) -> None:
    from harnessrl.runtime.proxy import tool_check

    compiled = []
    real = tool_check.validator_for
    monkeypatch.setattr(tool_check, "validator_for", lambda schema: compiled.append(schema) or real(schema))
    validators = ToolValidators()
    for _ in range(3):  # the same tools object on every call, as ToolsMemo gives it
        assert validators.check([BASH], [("bash", '{"command": "ls"}'), ("bash", "{}")]) == ToolMismatch(invalid=1)
    assert compiled == [BASH.function.parameters]
    # Tools made anew (a harness that changed them) are compiled again, and held to their own schema.
    relaxed = FunctionTool(function=FunctionDefinition(name="bash", parameters={"type": "object"}))
    assert validators.check([relaxed], [("bash", "{}")]) == ToolMismatch()
    assert len(compiled) == 2
