"""Property-based fuzz of the four request schemas: whatever arrives (random bytes, random JSON,
a valid request with one part replaced, deleted or wrapped), `parse_request` either reads it or
raises `DialectError` 400, whose rendering is an error body in that dialect's shape; what it
reads is a serialisable upstream body whose response and stream render without error."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from harnessrl.runtime.proxy.dialects.base import (
    Dialect,
    DialectError,
    ParsedRequest,
    RouteInfo,
    completion_as_chunks,
)
from harnessrl.runtime.proxy.dialects.routes import DIALECTS, match_route
from harnessrl.runtime.proxy.dialects.upstream import Completion
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SEEDS: dict[str, tuple[str, dict[str, Any]]] = {
    "openai_chat": (
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "text", "text": "u"}]},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "r"}]},
            ],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": "auto",
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 10,
            "stop": ["x"],
        },
    ),
    "openai_responses": (
        "/v1/responses",
        {
            "model": "m",
            "instructions": "i",
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "u"}]},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "d", "name": "g", "namespace": "n", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "r"},
                {"type": "custom_tool_call_output", "call_id": "d", "output": [{"type": "input_text", "text": "r"}]},
            ],
            "tools": [
                {"type": "function", "name": "f", "parameters": {"type": "object"}},
                {"type": "namespace", "name": "n", "description": "d", "tools": [{"type": "function", "name": "g"}]},
                {"type": "custom", "name": "p"},
                {"type": "web_search"},
            ],
            "tool_choice": {"type": "function", "name": "g", "namespace": "n"},
            "stream": True,
            "text": {"format": {"type": "text"}},
        },
    ),
    "anthropic": (
        "/v1/messages",
        {
            "model": "m",
            "max_tokens": 10,
            "system": [{"type": "text", "text": "s"}],
            "messages": [
                {"role": "user", "content": "u"},
                {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "tool_use", "id": "c", "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": [{"type": "text", "text": "r"}]}]},
            ],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}, {"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "auto"},
            "stream": True,
        },
    ),
    "gemini": (
        "/v1beta/models/g:streamGenerateContent",
        {
            "systemInstruction": {"parts": [{"text": "s"}]},
            "contents": [
                {"role": "user", "parts": [{"text": "u"}]},
                {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"output": "r"}}}]},
            ],
            "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT"}}]}, {"googleSearch": {}}],
            "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
            "generationConfig": {"maxOutputTokens": 10, "stopSequences": ["x"]},
        },
    ),
}

COMPLETION = Completion.model_validate(
    {
        "id": "chatcmpl-1",
        "model": "served",
        "choices": [
            {
                "message": {"role": "assistant", "content": "hi", "reasoning": "r", "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


def _assert_error_shape(dialect: Dialect, error: DialectError) -> None:
    assert error.status == 400, (error.status, error.message)
    rendered = dialect.render_error(error)
    body = json.loads(json.dumps(rendered.body))
    if dialect.name == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert isinstance(body["error"]["message"], str)
    elif dialect.name == "gemini":
        assert body["error"]["code"] == 400 and body["error"]["status"] == "INVALID_ARGUMENT"
    else:
        assert body["error"]["type"] == "invalid_request_error" and isinstance(body["error"]["message"], str)


async def _drain(dialect: Dialect, parsed: ParsedRequest) -> bytes:
    return b"".join([b async for b in dialect.render_stream(completion_as_chunks(COMPLETION), parsed)])


def _check(name: str, body: bytes | dict[str, Any]) -> None:
    path, _ = SEEDS[name]
    route = match_route(path)
    assert isinstance(route, RouteInfo)
    dialect = DIALECTS[name]
    try:
        parsed = dialect.parse_request(body, route)
    except DialectError as exc:
        _assert_error_shape(dialect, exc)
        return
    json.dumps(parsed.canonical.upstream_body())
    json.dumps(dialect.render_response(COMPLETION, parsed))
    assert asyncio.run(_drain(dialect, parsed)).startswith(b"event: " if name in ("anthropic", "openai_responses") else b"data: ")


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(seed: dict[str, Any], path: tuple[Any, ...], action: str, new: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(seed))
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "wrap":
        parent[last] = [parent[last]]
    else:
        parent[last] = new
    return body


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_seeds_are_valid() -> None:
    for name, (path, seed) in SEEDS.items():
        route = match_route(path)
        assert route is not None
        parsed = DIALECTS[name].parse_request(seed, route)
        assert parsed.canonical.messages and parsed.canonical.tools
        _check(name, json.dumps(seed).encode())


@FUZZ
@given(name=st.sampled_from(sorted(SEEDS)), data=st.data())
def test_one_part_of_a_valid_request_replaced(name: str, data: st.DataObject) -> None:
    seed = SEEDS[name][1]
    path = data.draw(st.sampled_from(_paths(seed)))
    action = data.draw(st.sampled_from(["replace", "delete", "wrap"]))
    _check(name, _mutate(seed, path, action, data.draw(json_values)))


@FUZZ
@given(name=st.sampled_from(sorted(SEEDS)), body=json_values)
def test_random_json(name: str, body: Any) -> None:
    _check(name, json.dumps(body).encode())


@FUZZ
@given(name=st.sampled_from(sorted(SEEDS)), body=st.binary(max_size=64))
def test_random_bytes(name: str, body: bytes) -> None:
    _check(name, body)


@FUZZ
@given(name=st.sampled_from(sorted(SEEDS)), extra=st.dictionaries(st.sampled_from(
    ["model", "messages", "input", "contents", "tools", "tool_choice", "system", "stream", "max_tokens", "n",
     "generationConfig", "toolConfig", "instructions", "previous_response_id", "systemInstruction", "stop"]), json_values, max_size=4))
def test_known_fields_with_random_values(name: str, extra: dict[str, Any]) -> None:
    _check(name, {**SEEDS[name][1], **extra})
