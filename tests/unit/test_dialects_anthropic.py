"""Anthropic Messages dialect: the official `anthropic` SDK against the dialect layer (through
httpx's ASGI transport to the stand-in app of tests/fixtures/dialects_app.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import httpx2
import pytest
from fastapi import FastAPI
from harnessrl.runtime.proxy.dialects.anthropic import AnthropicDialect
from harnessrl.runtime.proxy.dialects.base import (
    ChatMessage,
    DialectError,
    FunctionCall,
    RouteInfo,
    TextPart,
    ToolCall,
)
from harnessrl.runtime.proxy.dialects.upstream import Completion, CompletionChunk

from tests.fixtures.dialects_app import TRAINING_HEADER, scripted_completion, vllm_chunks

TOOLS: list[Any] = [
    {
        "name": "Bash",
        "description": "Run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
]
USER: Any = [{"role": "user", "content": "hi"}]
ROUTE = RouteInfo(dialect="anthropic")


def client(app: FastAPI, **headers: str) -> anthropic.AsyncAnthropic:
    # The anthropic SDK runs on httpx2 (the maintained fork of httpx) and refuses httpx clients.
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://proxy", headers=headers)
    return anthropic.AsyncAnthropic(api_key="sess-123", base_url="http://proxy", http_client=http, max_retries=0)


async def test_claude_code_shaped_request_becomes_the_canonical_request(dialects_app: FastAPI) -> None:
    # Claude Code: beta endpoint (?beta=true), system blocks led by a billing header, history
    # with thinking, tool_use and tool_result blocks, a server tool beside its own tools.
    await client(dialects_app).beta.messages.create(
        model="claude-sonnet",
        max_tokens=512,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0; cc_entrypoint=sdk-cli"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "x-anthropic-billing-header: cch=ab12;\nBe brief."},
        ],
        messages=[
            {"role": "user", "content": "list files"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "Running ls."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a.txt"}]},
                    {"type": "text", "text": "<system-reminder>keep going</system-reminder>"},
                ],
            },
        ],
        tools=TOOLS,
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        stop_sequences=["</done>"],
        extra_body={"temperature": 0.5, "top_k": 5},  # this SDK release no longer offers sampling knobs
    )
    parsed = dialects_app.state.seen[0]
    assert parsed.canonical.messages == [
        ChatMessage(role="system", content=[TextPart(text="You are Claude Code."), TextPart(text="Be brief.")]),
        ChatMessage(role="user", content="list files"),
        ChatMessage(
            role="assistant",
            content="Running ls.",
            tool_calls=[ToolCall(id="toolu_1", function=FunctionCall(name="Bash", arguments='{"command":"ls"}'))],
        ),
        ChatMessage(role="tool", tool_call_id="toolu_1", content="a.txt"),
        ChatMessage(role="user", content="<system-reminder>keep going</system-reminder>"),
    ]
    body = parsed.canonical.upstream_body()
    assert [t["function"]["name"] for t in body["tools"]] == ["Bash"]
    assert parsed.dropped_tools == ["web_search_20250305:web_search"]
    assert (body["tool_choice"], body["parallel_tool_calls"], body["max_tokens"]) == ("auto", False, 512)
    assert (body["stop"], body["temperature"]) == (["</done>"], 0.5)
    assert "top_k" not in body


async def test_sdk_parses_thinking_text_and_tool_use(dialects_app: FastAPI) -> None:
    msg = await client(dialects_app).messages.create(model="claude-sonnet", max_tokens=100, messages=USER, tools=TOOLS)
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"]
    thinking, text, tool = msg.content
    assert thinking.type == "thinking" and thinking.thinking == "I should look first."
    assert text.type == "text" and text.text == "Let me check."
    assert tool.type == "tool_use" and (tool.id, tool.name, tool.input) == ("chatcmpl-tool-1a2b3c", "Bash", {"command": "ls -la"})
    assert msg.stop_reason == "tool_use" and msg.model == "claude-sonnet"
    expected = scripted_completion(dialects_app.state.seen[0].canonical).usage
    assert expected is not None
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (expected.prompt_tokens, expected.completion_tokens)


async def test_sdk_stream_accumulates_the_same_message(dialects_app: FastAPI) -> None:
    async with client(dialects_app).messages.stream(model="claude-sonnet", max_tokens=100, messages=USER, tools=TOOLS) as stream:
        texts = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == "Let me check."
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    tool = final.content[2]
    assert tool.type == "tool_use" and tool.input == {"command": "ls -la"}
    assert final.stop_reason == "tool_use"
    expected = scripted_completion(dialects_app.state.seen[0].canonical).usage
    assert expected is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (expected.prompt_tokens, expected.completion_tokens)


async def test_tool_result_round_trip_ends_the_turn(dialects_app: FastAPI) -> None:
    messages: list[Any] = [
        *USER,
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt b.txt", "is_error": False}]},
    ]
    async with client(dialects_app).messages.stream(model="m", max_tokens=100, messages=messages, tools=TOOLS) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "end_turn"
    assert final.content[-1].type == "text" and final.content[-1].text == "Done. Last input: a.txt b.txt"


def _completion(finish: str, stop_reason: str | None) -> Completion:
    return Completion.model_validate(
        {"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": finish, "stop_reason": stop_reason}]}
    )


@pytest.mark.parametrize(
    ("finish", "vllm_stop", "stop_reason", "stop_sequence"),
    [("stop", "</done>", "stop_sequence", "</done>"), ("stop", None, "end_turn", None), ("length", None, "max_tokens", None), ("stop", 151645, "end_turn", None)],
)
async def test_stop_reasons(finish: str, vllm_stop: Any, stop_reason: str, stop_sequence: str | None) -> None:
    dialect = AnthropicDialect()
    parsed = dialect.parse_request({"model": "m", "max_tokens": 5, "messages": USER, "stop_sequences": ["</done>"]}, ROUTE)
    completion = _completion(finish, vllm_stop)
    body = dialect.render_response(completion, parsed)
    assert (body["stop_reason"], body["stop_sequence"]) == (stop_reason, stop_sequence)

    async def chunks() -> AsyncIterator[CompletionChunk]:
        async for c in vllm_chunks(completion):
            yield c

    data = b"".join([b async for b in dialect.render_stream(chunks(), parsed)])
    assert f'"stop_reason":"{stop_reason}"'.encode() in data


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"tool_choice": {"type": "any"}}, "forces a tool call"),
        ({"tool_choice": {"type": "tool", "name": "Bash"}}, "'Bash'"),
        ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "structured output"),
    ],
)
async def test_training_refuses_constrained_decoding(dialects_app: FastAPI, extra: dict[str, Any], needle: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as err:
        await client(dialects_app, **{TRAINING_HEADER: "1"}).messages.create(
            model="m", max_tokens=10, messages=USER, tools=TOOLS, **extra
        )
    assert needle in err.value.message
    assert err.value.body == {"type": "error", "error": {"type": "invalid_request_error", "message": err.value.body["error"]["message"]}}  # type: ignore[index]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"model": "m", "messages": USER}, "max_tokens"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "text-only"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"model": "m", "max_tokens": 5, "messages": USER, "tool_choice": {"type": "tool"}}, "needs a name"),
        ({"model": 7, "max_tokens": 5, "messages": USER}, "model"),
    ],
)
async def test_bad_requests_get_anthropic_400s(dialects_app: FastAPI, body: dict[str, Any], needle: str) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=dialects_app), base_url="http://p") as http:
        resp = await http.post("/v1/messages", json=body, headers={"x-api-key": "k"})
    assert resp.status_code == 400
    err = resp.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert needle in err["error"]["message"]


async def test_count_tokens(dialects_app: FastAPI) -> None:
    counted = await client(dialects_app).messages.count_tokens(model="m", messages=USER, tools=TOOLS)
    assert counted.input_tokens > 0
    assert dialects_app.state.seen[0].operation == "count_tokens"


def test_overloaded_is_529_with_retry_after() -> None:
    rendered = AnthropicDialect().render_error(DialectError("busy", "overloaded", retry_after=3))
    assert (rendered.status, rendered.headers) == (529, {"retry-after": "3"})
    assert rendered.body == {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}


def _sdk_over(data: bytes) -> anthropic.AsyncAnthropic:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=data, headers={"content-type": "text/event-stream"})

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    return anthropic.AsyncAnthropic(api_key="k", base_url="http://p", http_client=http)


async def test_final_message_streams_as_a_normal_turn() -> None:
    dialect = AnthropicDialect()
    parsed = dialect.parse_request({"model": "m", "max_tokens": 5, "messages": USER, "stream": True}, ROUTE)
    rendered = dialect.render_final("Budget spent; stopping.", parsed)
    assert not isinstance(rendered, dict)
    data = b"".join([b async for b in rendered])
    async with _sdk_over(data).messages.stream(model="m", max_tokens=5, messages=USER) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "end_turn" and final.content[0].type == "text"
    assert final.content[0].text == "Budget spent; stopping."


async def test_mid_stream_failure_raises_in_the_sdk() -> None:
    dialect = AnthropicDialect()
    parsed = dialect.parse_request({"model": "m", "max_tokens": 5, "messages": USER, "stream": True}, ROUTE)

    async def broken() -> AsyncIterator[CompletionChunk]:
        async for chunk in vllm_chunks(scripted_completion(parsed.canonical)):
            yield chunk
            raise DialectError("the engine stream broke", "upstream")

    data = b"".join([b async for b in dialect.render_stream(broken(), parsed)])
    with pytest.raises(anthropic.APIStatusError, match="engine stream broke"):
        async with _sdk_over(data).messages.stream(model="m", max_tokens=5, messages=USER) as stream:
            await stream.get_final_message()


def test_system_messages_inside_messages_stay_in_place() -> None:
    # Claude Code 2.1 sends reminders as `role: "system"` messages mid-conversation (string or text blocks).
    dialect = AnthropicDialect()
    parsed = dialect.parse_request(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": "reminder one"},
                {"role": "system", "content": [{"type": "text", "text": "reminder two"}]},
                {"role": "user", "content": "go on"},
            ],
        },
        ROUTE,
    )
    messages = parsed.canonical.messages
    assert [m.role for m in messages] == ["user", "system", "system", "user"]
    assert [m.content for m in messages][1:3] == ["reminder one", "reminder two"]
