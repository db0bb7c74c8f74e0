"""OpenAI Chat Completions dialect: the official `openai` SDK against the dialect layer.

Requests are built by the SDK itself and sent through httpx's ASGI transport to the stand-in
app (tests/fixtures/dialects_app.py), which parses them with the dialect and answers from a
canned engine in vLLM's shape; the SDK then parses what the dialect rendered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import openai
import pytest
from fastapi import FastAPI
from harnessrl.runtime.proxy.dialects.base import (
    ChatMessage,
    DialectError,
    FunctionCall,
    ParsedRequest,
    RouteInfo,
    TextPart,
    ToolCall,
)
from harnessrl.runtime.proxy.dialects.openai_chat import OpenAIChatDialect
from harnessrl.runtime.proxy.dialects.upstream import CompletionChunk

from tests.fixtures.dialects_app import TRAINING_HEADER, scripted_completion, vllm_chunks

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]
ROUTE = RouteInfo(dialect="openai_chat")


def client(app: FastAPI, key: str = "sess-123", **headers: str) -> openai.AsyncOpenAI:
    # The openai SDK's transport library is httpx2 (the maintained fork of httpx).
    transport = httpx2.ASGITransport(app=app)
    http = httpx2.AsyncClient(transport=transport, base_url="http://proxy", headers=headers)
    return openai.AsyncOpenAI(api_key=key, base_url="http://proxy/v1", http_client=http, max_retries=0)


async def test_sdk_request_becomes_the_canonical_request(dialects_app: FastAPI) -> None:
    await client(dialects_app).chat.completions.create(
        model="qwen-tiny",
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": [{"type": "text", "text": "list files"}, {"type": "text", "text": "please"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "run_shell", "arguments": '{"command":"ls"}'}}],
            },
            # Qwen Code sends tool results as an array of parts.
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a.txt"}]},
        ],
        tools=TOOLS,
        tool_choice="auto",
        max_completion_tokens=64,
        temperature=0.7,
        stop="END",
        top_p=0.5,
        extra_body={"store": True},
    )
    parsed: ParsedRequest = dialects_app.state.seen[0]
    canonical = parsed.canonical
    assert canonical.messages == [
        ChatMessage(role="system", content="You are terse."),
        ChatMessage(role="system", content="Use tools."),
        ChatMessage(role="user", content=[TextPart(text="list files"), TextPart(text="please")]),
        ChatMessage(role="assistant", tool_calls=[ToolCall(id="c1", function=FunctionCall(name="run_shell", arguments='{"command":"ls"}'))]),
        ChatMessage(role="tool", tool_call_id="c1", content="a.txt"),
    ]
    body = canonical.upstream_body()
    assert body["tools"][0]["function"]["name"] == "run_shell"
    assert (body["max_tokens"], body["temperature"], body["stop"], body["tool_choice"]) == (64, 0.7, ["END"], "auto")
    assert body["top_p"] == 0.5  # passed on; the proxy resets it
    assert "store" not in body and not parsed.stream


async def test_sdk_parses_a_tool_call_response(dialects_app: FastAPI) -> None:
    resp = await client(dialects_app).chat.completions.create(
        model="qwen-tiny", messages=[{"role": "user", "content": "hi"}], tools=TOOLS
    )
    choice = resp.choices[0]
    assert resp.model == "qwen-tiny"
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    call = choice.message.tool_calls[0]  # type: ignore[index]
    assert call.id == "chatcmpl-tool-1a2b3c" and call.function.name == "run_shell"  # type: ignore[union-attr]
    assert call.function.arguments == '{"command": "ls -la"}'  # type: ignore[union-attr]
    assert (choice.message.model_extra or {})["reasoning_content"] == "I should look first."
    expected = scripted_completion(dialects_app.state.seen[0].canonical).usage
    assert resp.usage is not None and expected is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (expected.prompt_tokens, expected.completion_tokens)


async def test_sdk_stream_accumulates_tool_call_reasoning_and_usage(dialects_app: FastAPI) -> None:
    async with client(dialects_app).chat.completions.stream(
        model="qwen-tiny",
        messages=[{"role": "user", "content": "hi"}],
        tools=TOOLS,
        stream_options={"include_usage": True},
    ) as stream:
        reasoning = ""
        async for event in stream:
            if event.type == "chunk" and event.chunk.choices:
                reasoning += (event.chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        final = await stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    assert reasoning == "I should look first."
    call = choice.message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "run_shell" and call.function.arguments == '{"command": "ls -la"}'
    assert final.usage is not None and final.usage.completion_tokens == 12


async def test_stream_without_include_usage_has_no_usage_chunk(dialects_app: FastAPI) -> None:
    stream = await client(dialects_app).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    chunks = [c async for c in stream]
    assert all(c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Done. Last input: hi"


async def test_length_finish(dialects_app: FastAPI) -> None:
    resp = await client(dialects_app).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=1
    )
    assert resp.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"logit_bias": {"42": 5}}, "logit_bias"),
        ({"tool_choice": "required", "tools": TOOLS}, "forces a tool call"),
        ({"tool_choice": {"type": "function", "function": {"name": "run_shell"}}, "tools": TOOLS}, "run_shell"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "structured output"),
        ({"extra_body": {"guided_json": {"type": "object"}}}, "guided_json"),
        ({"extra_body": {"structured_outputs": {"regex": "a+"}}}, "structured_outputs"),
    ],
)
async def test_training_session_refuses_constrained_decoding(dialects_app: FastAPI, kwargs: dict[str, Any], needle: str) -> None:
    training = client(dialects_app, **{TRAINING_HEADER: "1"})
    with pytest.raises(openai.BadRequestError) as err:
        await training.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], **kwargs)
    assert needle in err.value.message and "constrained decoding" in err.value.message
    # Outside training the same request is served.
    await client(dialects_app).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], **kwargs)


@pytest.mark.parametrize(
    ("messages", "extra", "needle"),
    [
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}], {}, "text-only"),
        ([{"role": "user", "content": "hi"}], {"n": 2}, "n must be 1"),
        ([], {}, "messages"),
        ([{"role": "tool", "content": "x"}], {}, "tool_call_id"),
        ([{"role": "user", "content": "hi"}], {"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "function tools"),
    ],
)
async def test_bad_requests_get_openai_400s(dialects_app: FastAPI, messages: list[Any], extra: dict[str, Any], needle: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await client(dialects_app).chat.completions.create(model="m", messages=messages, **extra)
    assert needle in err.value.message
    assert isinstance(err.value.body, dict) and err.value.body["type"] == "invalid_request_error"


async def test_missing_key_is_a_401_and_malformed_json_a_400(dialects_app: FastAPI) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=dialects_app), base_url="http://p") as http:
        anonymous = await http.post("/v1/chat/completions", json={"model": "m", "messages": []})
        resp = await http.post("/v1/chat/completions", content=b"{not json", headers={"authorization": "Bearer k"})
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "invalid_api_key"
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error" and "not valid JSON" in resp.json()["error"]["message"]


def test_rate_limit_error_has_retry_after() -> None:
    rendered = OpenAIChatDialect().render_error(DialectError("slow down", "rate_limit", retry_after=2.4))
    assert rendered.status == 429 and rendered.headers == {"retry-after": "2"}
    assert rendered.body["error"]["code"] == "rate_limit_exceeded"


async def _replay(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _sse_response(data: bytes) -> httpx2.Response:
    return httpx2.Response(200, content=data, headers={"content-type": "text/event-stream"})


async def test_final_message_parses_as_a_normal_completion() -> None:
    dialect = OpenAIChatDialect()
    parsed = dialect.parse_request({"model": "m", "messages": [{"role": "user", "content": "x"}]}, ROUTE)
    body = dialect.render_final("The call budget of this episode is spent.", parsed)
    assert isinstance(body, dict)
    done = openai.types.chat.ChatCompletion.model_validate(body)
    assert done.choices[0].message.content == "The call budget of this episode is spent."
    assert done.choices[0].finish_reason == "stop" and not done.choices[0].message.tool_calls


async def test_mid_stream_failure_raises_in_the_sdk() -> None:
    async def broken() -> AsyncIterator[CompletionChunk]:
        async for chunk in vllm_chunks(scripted_completion(parsed.canonical)):
            yield chunk
            raise DialectError("the engine stream broke", "upstream")

    dialect = OpenAIChatDialect()
    parsed = dialect.parse_request({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}, ROUTE)
    data = b"".join([b async for b in dialect.render_stream(broken(), parsed)])

    def handler(request: httpx2.Request) -> httpx2.Response:
        return _sse_response(data)

    sdk = openai.AsyncOpenAI(api_key="k", base_url="http://p/v1", http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)))
    stream = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
    with pytest.raises(openai.APIError, match="engine stream broke"):
        async for _ in stream:
            pass
