"""Harness mismatch: a reply's tool calls held to the tools the call offered (runtime/proxy/tool_check.py)."""

from __future__ import annotations

from harnessrl.runtime.proxy.dialects.base import FunctionDefinition, FunctionTool
from harnessrl.runtime.proxy.tool_check import ToolMismatch, check_tool_calls

BASH = FunctionTool(function=FunctionDefinition(name="bash", parameters={
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"],
    "additionalProperties": False}))
TODO = FunctionTool(function=FunctionDefinition(name="todo"))  # no schema: any JSON object
BROKEN = FunctionTool(function=FunctionDefinition(name="broken", parameters={"type": "no-such-type"}))


def test_calls_the_harness_can_run_are_no_mismatch() -> None:
    calls = [("bash", '{"command": "ls"}'), ("todo", '{"items": [1]}'), ("todo", "")]
    assert check_tool_calls([BASH, TODO], calls) == ToolMismatch()
    assert not check_tool_calls([BASH, TODO], calls)


def test_a_tool_the_call_did_not_offer_is_unknown() -> None:
    # Another harness's editor, and any tool at all when the call offered none.
    assert check_tool_calls([BASH], [("str_replace_editor", '{"path": "a"}')]) == ToolMismatch(unknown=1)
    assert check_tool_calls(None, [("bash", '{"command": "ls"}')]) == ToolMismatch(unknown=1)


def test_arguments_the_schema_refuses_are_invalid() -> None:
    calls = [
        ("bash", '{"cmd": "ls"}'),  # required property missing, unknown one given
        ("bash", '{"command": 3}'),  # wrong type
        ("bash", '{"command": "ls"'),  # not JSON
        ("todo", '["a list"]'),  # not an object
    ]
    assert check_tool_calls([BASH, TODO], calls) == ToolMismatch(invalid=4)


def test_a_broken_schema_holds_no_call_to_it() -> None:
    assert check_tool_calls([BROKEN], [("broken", '{"x": 1}')]) == ToolMismatch()
