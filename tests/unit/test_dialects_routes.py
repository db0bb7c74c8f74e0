"""Routing by path, the session key, the canonical layer's constrained-decoding check, and the
shared stream reader."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from harnessrl.runtime.proxy.dialects.base import (
    DEFAULT_STATUS,
    MAX_JSON_DEPTH,
    CanonicalRequest,
    ChatMessage,
    DialectError,
    ErrorKind,
    Operation,
    constrained_decoding_reasons,
    load_json_object,
    reject_constrained_decoding,
)
from harnessrl.runtime.proxy.dialects.routes import (
    DEFAULT_DIALECT,
    DIALECTS,
    dialect_for,
    dialect_for_path,
    match_route,
    session_key,
)
from harnessrl.runtime.proxy.dialects.stream import (
    Finished,
    Started,
    TextDelta,
    ToolArgsDelta,
    ToolCallStart,
    stream_events,
)
from harnessrl.runtime.proxy.dialects.upstream import STREAM_CHUNK, CompletionChunk


@pytest.mark.parametrize(
    ("path", "dialect", "operation", "model", "stream", "prefix"),
    [
        ("/v1/chat/completions", "openai_chat", Operation.GENERATE, None, None, ""),
        ("/v1/responses", "openai_responses", Operation.GENERATE, None, None, ""),
        ("/v1/messages", "anthropic", Operation.GENERATE, None, None, ""),
        ("/v1/messages/count_tokens", "anthropic", Operation.COUNT_TOKENS, None, None, ""),
        ("/anthropic/v1/messages", "anthropic", Operation.GENERATE, None, None, "/anthropic"),
        ("/v1beta/models/gemini-2.5-pro:generateContent", "gemini", Operation.GENERATE, "gemini-2.5-pro", False, ""),
        ("/v1beta/models/g:streamGenerateContent", "gemini", Operation.GENERATE, "g", True, ""),
        ("/v1/models/g:countTokens", "gemini", Operation.COUNT_TOKENS, "g", False, ""),
        ("/a/b/v1beta/models/g:generateContent", "gemini", Operation.GENERATE, "g", False, "/a/b"),
    ],
)
def test_match_route(path: str, dialect: str, operation: Operation, model: str | None, stream: bool | None, prefix: str) -> None:
    route = match_route(path, {"alt": "sse"})
    assert route is not None
    assert (route.dialect, route.operation, route.model, route.stream, route.prefix) == (dialect, operation, model, stream, prefix)
    assert route.query == {"alt": "sse"} and dialect_for(route).name == dialect


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/messagesx", "/v1beta/models/g:embedContent", "/", "/v1/models"])
def test_unknown_paths_have_no_route_and_answer_in_the_default_dialect(path: str) -> None:
    assert match_route(path) is None
    assert dialect_for_path(path).name == DEFAULT_DIALECT
    assert dialect_for_path("/x/v1/messages").name == "anthropic"


@pytest.mark.parametrize(
    ("headers", "query", "key"),
    [
        ({"Authorization": "Bearer s1"}, {}, "s1"),
        ({"authorization": "bearer  s1 "}, {}, "s1"),
        ({"X-Api-Key": "s2"}, {}, "s2"),
        ({"x-goog-api-key": "s3"}, {}, "s3"),
        ({}, {"key": "s4"}, "s4"),
        ({"x-api-key": "s2", "authorization": "Bearer s1"}, {}, "s2"),
        ({"authorization": "Basic abc"}, {}, None),
        ({"authorization": "Bearer "}, {}, None),
        ({}, {}, None),
    ],
)
def test_session_key(headers: dict[str, str], query: dict[str, str], key: str | None) -> None:
    assert session_key(headers, query) == key


def _request(**fields: Any) -> CanonicalRequest:
    return CanonicalRequest(model="m", messages=[ChatMessage(role="user", content="x")], **fields)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"logit_bias": {"1": 2.0}}, "logit_bias"),
        ({"response_format": {"type": "json_object"}}, "structured output"),
        ({"guided_regex": "a+"}, "guided_regex"),
        ({"allowed_token_ids": [1, 2]}, "allowed_token_ids"),
        ({"tool_choice": "required"}, "forces a tool call"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "forces the tool 'f'"),
    ],
)
def test_constrained_decoding_is_detected(fields: dict[str, Any], reason: str) -> None:
    request = _request(**fields)
    assert any(reason in r for r in constrained_decoding_reasons(request))
    with pytest.raises(DialectError) as err:
        reject_constrained_decoding(request)
    assert err.value.status == 400 and reason in err.value.message


def test_free_sampling_is_not_constrained() -> None:
    request = _request(tool_choice="auto", response_format={"type": "text"}, logit_bias={}, temperature=1.0)
    assert constrained_decoding_reasons(request) == []
    reject_constrained_decoding(request)


@pytest.mark.parametrize("body", [b"[1]", b'"x"', b"\xff\xfe", b"{", b"[" * 5000 + b"]" * 5000])
def test_load_json_object_refuses_non_objects(body: bytes) -> None:
    with pytest.raises(DialectError) as err:
        load_json_object(body)
    assert err.value.status == 400


def test_load_json_object_refuses_deep_nesting() -> None:
    deep: Any = {}
    for _ in range(MAX_JSON_DEPTH + 1):
        deep = {"a": deep}
    with pytest.raises(DialectError, match="nested"):
        load_json_object(deep)


async def _chunks(*bodies: dict[str, Any]) -> AsyncIterator[CompletionChunk]:
    for body in bodies:
        yield STREAM_CHUNK.validate_python(body)


async def test_stream_events_handles_arguments_before_the_name_and_stop_strings() -> None:
    events = [
        e
        async for e in stream_events(
            _chunks(
                {"choices": [{"delta": {"role": "assistant", "content": ""}}], "prompt_token_ids": [1, 2, 3]},
                {"choices": [{"delta": {"content": "hi"}}]},
                {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}}]},
                {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "t", "function": {"name": "f", "arguments": ":1}"}}]}}]},
                {"choices": [{"delta": {}, "finish_reason": "stop", "stop_reason": "END"}]},
                {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}},
            )
        )
    ]
    assert events[:4] == [Started(3), TextDelta("hi"), ToolCallStart(0, "t", "f"), ToolArgsDelta(0, '{"a":1}')]
    finished = events[4]
    assert isinstance(finished, Finished) and (finished.reason, finished.stop_sequence) == ("stop", "END")
    assert finished.usage.output_tokens == 4 and len(events) == 5


@pytest.mark.parametrize("name", sorted(DIALECTS))
@pytest.mark.parametrize("kind", sorted(DEFAULT_STATUS))
def test_every_error_kind_renders_in_every_dialect(name: str, kind: ErrorKind) -> None:
    rendered = DIALECTS[name].render_error(DialectError("nope", kind, retry_after=1.6 if kind in ("rate_limit", "overloaded") else None))
    body = rendered.body
    if name == "anthropic":
        assert body["type"] == "error" and body["error"]["message"] == "nope"
        assert rendered.status == (529 if kind == "overloaded" else DEFAULT_STATUS[kind])
    elif name == "gemini":
        assert (body["error"]["code"], body["error"]["message"]) == (rendered.status, "nope")
        assert body["error"]["status"] == {"rate_limit": "RESOURCE_EXHAUSTED", "authentication": "UNAUTHENTICATED"}.get(kind, body["error"]["status"])
    else:
        assert body["error"]["message"] == "nope" and isinstance(body["error"]["type"], str)
    assert rendered.headers == ({"retry-after": "2"} if kind in ("rate_limit", "overloaded") else {})


FINAL_REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "openai_chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    "openai_responses": ("/v1/responses", {"model": "m", "input": "x"}),
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
    "gemini": ("/v1beta/models/m:generateContent", {"contents": [{"parts": [{"text": "x"}]}]}),
}
# A non-streaming final answer is text only and ends the turn.
ENDS_PLAINLY: dict[str, Any] = {
    "openai_chat": lambda b: b["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in b["choices"][0]["message"],
    "openai_responses": lambda b: b["status"] == "completed" and [i["type"] for i in b["output"]] == ["message"],
    "anthropic": lambda b: b["stop_reason"] == "end_turn" and [c["type"] for c in b["content"]] == ["text"],
    "gemini": lambda b: b["candidates"][0]["finishReason"] == "STOP" and list(b["candidates"][0]["content"]["parts"][0]) == ["text"],
}
# The terminal event each dialect's stream must end with.
TERMINAL = {"openai_chat": b"data: [DONE]", "openai_responses": b"event: response.completed",
            "anthropic": b"event: message_stop", "gemini": b'"finishReason":"STOP"'}


@pytest.mark.parametrize("name", sorted(FINAL_REQUESTS))
@pytest.mark.parametrize("stream", [False, True])
async def test_final_message_is_a_plain_ending_turn(name: str, stream: bool) -> None:
    path, body = FINAL_REQUESTS[name]
    if stream:
        path = path.replace(":generateContent", ":streamGenerateContent")
        body = {**body, "stream": True} if name != "gemini" else body
    route = match_route(path)
    assert route is not None
    dialect = DIALECTS[name]
    parsed = dialect.parse_request(body, route)
    assert parsed.stream is stream
    rendered = dialect.render_final("The call budget is spent.", parsed)
    if stream:
        assert not isinstance(rendered, dict)
        data = b"".join([b async for b in rendered])
        events = [e for e in data.split(b"\n\n") if e]
        assert TERMINAL[name] in events[-1]
    else:
        assert isinstance(rendered, dict)
        assert ENDS_PLAINLY[name](rendered), rendered
        data = json.dumps(rendered).encode()
    assert b"The call budget is spent." in data
