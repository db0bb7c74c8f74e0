"""OpenAI Responses dialect: the official `openai` SDK's Responses client against the dialect
layer (through httpx's ASGI transport to the stand-in app of tests/fixtures/dialects_app.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import openai
import pytest
from fastapi import FastAPI
from harnessrl.runtime.proxy.dialects.base import ChatMessage, DialectError, FunctionCall, RouteInfo, ToolCall
from harnessrl.runtime.proxy.dialects.openai_responses import OpenAIResponsesDialect
from harnessrl.runtime.proxy.dialects.upstream import CompletionChunk

from tests.fixtures.dialects_app import TRAINING_HEADER, scripted_completion, vllm_chunks

SHELL: Any = {
    "type": "function",
    "name": "shell",
    "description": "Run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "strict": False,
}
NAMESPACE: Any = {
    "type": "namespace",
    "name": "mcp__fs",
    "description": "file tools",
    "tools": [{"type": "function", "name": "read", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}],
}
CUSTOM: Any = {"type": "custom", "name": "apply_patch", "description": "Apply a patch", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
HOSTED: Any = {"type": "web_search"}
FORCE_SHELL: Any = {"type": "function", "name": "shell"}
HOSTED_CHOICE: Any = {"type": "web_search"}
# What Codex sends on a later turn: its whole history, reasoning and hosted-tool records included.
CODEX_HISTORY: Any = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: none"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
    {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"command":"ls"}'},
    {"type": "function_call", "call_id": "c2", "name": "read", "namespace": "mcp__fs", "arguments": '{"path":"a"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
    {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "hello"}]},
    {"type": "custom_tool_call", "call_id": "c3", "name": "apply_patch", "input": "*** Begin Patch"},
    {"type": "custom_tool_call_output", "call_id": "c3", "output": "ok"},
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "x"}},
]
ROUTE = RouteInfo(dialect="openai_responses")


def client(app: FastAPI, **headers: str) -> openai.AsyncOpenAI:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://proxy", headers=headers)
    return openai.AsyncOpenAI(api_key="sess-123", base_url="http://proxy/v1", http_client=http, max_retries=0)


async def test_codex_shaped_request_becomes_the_canonical_request(dialects_app: FastAPI) -> None:
    stream = await client(dialects_app).responses.create(
        model="gpt-5-codex",
        instructions="You are Codex.",
        input=CODEX_HISTORY,
        tools=[SHELL, NAMESPACE, CUSTOM, HOSTED],
        tool_choice="auto",
        parallel_tool_calls=False,
        store=False,
        stream=True,
        reasoning={"effort": "medium", "summary": "auto"},
        include=["reasoning.encrypted_content"],
        max_output_tokens=256,
    )
    async for _ in stream:
        pass
    parsed = dialects_app.state.seen[0]
    assert parsed.canonical.messages == [
        ChatMessage(role="system", content="You are Codex."),
        ChatMessage(role="system", content="sandbox: none"),
        ChatMessage(role="user", content="fix it"),
        ChatMessage(
            role="assistant",
            content="Looking.",
            tool_calls=[
                ToolCall(id="c1", function=FunctionCall(name="shell", arguments='{"command":"ls"}')),
                ToolCall(id="c2", function=FunctionCall(name="mcp__fs__read", arguments='{"path":"a"}')),
            ],
        ),
        ChatMessage(role="tool", tool_call_id="c1", content="a.txt"),
        ChatMessage(role="tool", tool_call_id="c2", content="hello"),
        ChatMessage(
            role="assistant",
            tool_calls=[ToolCall(id="c3", function=FunctionCall(name="apply_patch", arguments='{"input":"*** Begin Patch"}'))],
        ),
        ChatMessage(role="tool", tool_call_id="c3", content="ok"),
    ]
    body = parsed.canonical.upstream_body()
    assert [t["function"]["name"] for t in body["tools"]] == ["shell", "mcp__fs__read", "apply_patch"]
    assert body["tools"][2]["function"]["parameters"]["required"] == ["input"]
    assert (body["tool_choice"], body["parallel_tool_calls"], body["max_tokens"], body["stream"]) == ("auto", False, 256, True)
    assert parsed.dropped_tools == ["web_search"]


async def test_sdk_parses_reasoning_message_and_function_call(dialects_app: FastAPI) -> None:
    resp = await client(dialects_app).responses.create(model="m", input="hi", tools=[SHELL])
    assert [item.type for item in resp.output] == ["reasoning", "message", "function_call"]
    reasoning, _, call = resp.output
    assert reasoning.type == "reasoning" and reasoning.content and reasoning.content[0].text == "I should look first."
    assert resp.output_text == "Let me check."
    assert call.type == "function_call" and (call.name, call.call_id, call.arguments) == ("shell", "chatcmpl-tool-1a2b3c", '{"command": "ls -la"}')
    assert resp.status == "completed" and resp.model == "m"
    expected = scripted_completion(dialects_app.state.seen[0].canonical).usage
    assert resp.usage is not None and expected is not None
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (expected.prompt_tokens, expected.completion_tokens)


async def test_sdk_stream_accumulates_the_same_response(dialects_app: FastAPI) -> None:
    async with client(dialects_app).responses.stream(model="m", input="hi", tools=[SHELL]) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    for needed in ("response.reasoning_text.delta", "response.output_text.delta", "response.function_call_arguments.delta",
                   "response.function_call_arguments.done", "response.content_part.done"):
        assert needed in kinds
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.output_text == "Let me check."
    call = final.output[2]
    assert call.type == "function_call" and call.arguments == '{"command": "ls -la"}'
    assert final.usage is not None and final.usage.output_tokens == 12


@pytest.mark.parametrize("stream", [False, True])
async def test_namespace_and_custom_tool_calls_are_rendered_back(dialects_app: FastAPI, stream: bool) -> None:
    sdk = client(dialects_app)
    for tools, check in [
        ([NAMESPACE], lambda item: item.type == "function_call" and (item.name, item.namespace) == ("read", "mcp__fs")),
        ([CUSTOM], lambda item: item.type == "custom_tool_call" and (item.name, item.input) == ("apply_patch", "ls -la")),
    ]:
        resp: Any
        if stream:
            async with sdk.responses.stream(model="m", input="hi", tools=tools) as s:
                resp = await s.get_final_response()
        else:
            resp = await sdk.responses.create(model="m", input="hi", tools=tools)
        assert check(resp.output[-1]), resp.output[-1]


async def test_length_is_incomplete(dialects_app: FastAPI) -> None:
    resp = await client(dialects_app).responses.create(model="m", input="hi", max_output_tokens=1)
    assert resp.status == "incomplete" and resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    async with client(dialects_app).responses.stream(model="m", input="hi", max_output_tokens=1) as s:
        kinds = [e.type async for e in s]
    assert kinds[-1] == "response.incomplete"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}, "text-only"),
        ({"input": [{"type": "mystery"}]}, "mystery"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "x"}]}, "arguments"),
        ({"input": []}, "empty"),
    ],
)
async def test_bad_requests_get_openai_400s(dialects_app: FastAPI, kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await client(dialects_app).responses.create(model="m", **{"input": "hi", **kwargs})
    assert needle in err.value.message


async def test_training_refuses_structured_output_and_forced_tools(dialects_app: FastAPI) -> None:
    training = client(dialects_app, **{TRAINING_HEADER: "1"})
    fmt: Any = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError, match="structured output"):
        await training.responses.create(model="m", input="hi", text=fmt)
    with pytest.raises(openai.BadRequestError, match="'shell'"):
        await training.responses.create(model="m", input="hi", tools=[SHELL], tool_choice=FORCE_SHELL)
    # A hosted tool choice is not forcing anything upstream.
    await training.responses.create(model="m", input="hi", tools=[SHELL, HOSTED], tool_choice=HOSTED_CHOICE)


async def test_mid_stream_failure_ends_in_response_failed() -> None:
    dialect = OpenAIResponsesDialect()
    parsed = dialect.parse_request({"model": "m", "input": "x", "stream": True}, ROUTE)

    async def broken() -> AsyncIterator[CompletionChunk]:
        async for chunk in vllm_chunks(scripted_completion(parsed.canonical)):
            yield chunk
            raise DialectError("the engine stream broke", "upstream")

    data = b"".join([b async for b in dialect.render_stream(broken(), parsed)])

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=data, headers={"content-type": "text/event-stream"})

    sdk = openai.AsyncOpenAI(api_key="k", base_url="http://p/v1", http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)))
    stream = await sdk.responses.create(model="m", input="x", stream=True)
    events = [e async for e in stream]
    last = events[-1]
    assert last.type == "response.failed" and last.response.error is not None
    assert last.response.error.message == "the engine stream broke"
    assert [e.sequence_number for e in events] == list(range(len(events)))
