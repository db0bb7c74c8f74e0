"""Gemini dialect: the official `google-genai` SDK against the dialect layer (through httpx's
ASGI transport to the stand-in app of tests/fixtures/dialects_app.py), plus snake_case bodies."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from google import genai
from google.genai import errors, types
from harnessrl.runtime.proxy.dialects.base import ChatMessage, DialectError, FunctionCall, RouteInfo, ToolCall
from harnessrl.runtime.proxy.dialects.gemini import GeminiDialect
from harnessrl.runtime.proxy.dialects.upstream import CompletionChunk

from tests.fixtures.dialects_app import TRAINING_HEADER, scripted_completion, vllm_chunks

SHELL = types.FunctionDeclaration(
    name="run_shell_command",
    description="Run a command",
    parameters=types.Schema(type=types.Type.OBJECT, properties={"command": types.Schema(type=types.Type.STRING)}, required=["command"]),
)
TOOLS = [types.Tool(function_declarations=[SHELL]), types.Tool(google_search=types.GoogleSearch())]
ROUTE = RouteInfo(dialect="gemini", model="gemini-2.5-pro")


def client(app: FastAPI, **headers: str) -> genai.Client:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")
    options = types.HttpOptions(base_url="http://proxy", headers=headers or None, httpx_async_client=http)
    return genai.Client(api_key="sess-123", http_options=options)


HISTORY: list[Any] = [
    types.Content(role="user", parts=[types.Part(text="list files")]),
    types.Content(
        role="model",
        parts=[
            types.Part(text="thinking...", thought=True),
            types.Part(text="Running ls."),
            types.Part(function_call=types.FunctionCall(name="run_shell_command", args={"command": "ls"})),
        ],
    ),
    types.Content(
        role="user",
        parts=[types.Part(function_response=types.FunctionResponse(name="run_shell_command", response={"output": "a.txt"}))],
    ),
]
EXPECTED = [
    ChatMessage(role="system", content="You are Gemini CLI."),
    ChatMessage(role="user", content="list files"),
    ChatMessage(
        role="assistant",
        content="Running ls.",
        tool_calls=[ToolCall(id="call_1", function=FunctionCall(name="run_shell_command", arguments='{"command":"ls"}'))],
    ),
    ChatMessage(role="tool", tool_call_id="call_1", content="a.txt"),
]


async def test_sdk_request_becomes_the_canonical_request(dialects_app: FastAPI) -> None:
    config = types.GenerateContentConfig(
        system_instruction="You are Gemini CLI.",
        tools=TOOLS,
        tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode=types.FunctionCallingConfigMode.AUTO)),
        max_output_tokens=300,
        temperature=0.3,
        top_p=0.9,
        stop_sequences=["STOP!"],
        thinking_config=types.ThinkingConfig(include_thoughts=True),
    )
    await client(dialects_app).aio.models.generate_content(model="gemini-2.5-pro", contents=HISTORY, config=config)
    parsed = dialects_app.state.seen[0]
    assert parsed.canonical.messages == EXPECTED
    body = parsed.canonical.upstream_body()
    assert body["model"] == "gemini-2.5-pro" and parsed.requested_model == "gemini-2.5-pro"
    fn = body["tools"][0]["function"]
    assert fn["name"] == "run_shell_command"
    assert fn["parameters"] == {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
    assert (body["max_tokens"], body["temperature"], body["stop"], body["tool_choice"]) == (300, 0.3, ["STOP!"], "auto")
    assert "top_p" not in body and parsed.dropped_tools == ["googleSearch"]


async def test_snake_case_body_reads_the_same(dialects_app: FastAPI) -> None:
    body = {
        "system_instruction": {"parts": [{"text": "You are Gemini CLI."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "list files"}]},
            {"role": "model", "parts": [{"text": "Running ls."}, {"function_call": {"name": "run_shell_command", "args": {"command": "ls"}}}]},
            {"role": "user", "parts": [{"function_response": {"name": "run_shell_command", "response": {"output": "a.txt"}}}]},
        ],
        "tools": [{"function_declarations": [{"name": "run_shell_command", "parameters_json_schema": {"type": "object"}}]}],
        "generation_config": {"max_output_tokens": 300, "stop_sequences": ["STOP!"]},
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=dialects_app), base_url="http://p") as http:
        resp = await http.post("/v1beta/models/gemini-2.5-pro:generateContent?key=sess-1", json=body)
    assert resp.status_code == 200, resp.text
    canonical = dialects_app.state.seen[0].canonical
    assert canonical.messages == EXPECTED
    assert (canonical.max_tokens, canonical.stop) == (300, ["STOP!"])
    assert canonical.tools and canonical.tools[0].function.parameters == {"type": "object"}


async def test_sdk_parses_thought_text_and_function_call(dialects_app: FastAPI) -> None:
    config = types.GenerateContentConfig(tools=TOOLS)
    resp = await client(dialects_app).aio.models.generate_content(model="gemini-2.5-pro", contents="hi", config=config)
    assert resp.candidates
    parts = resp.candidates[0].content.parts  # type: ignore[union-attr]
    assert parts is not None
    assert [(p.thought, p.text) for p in parts[:2]] == [(True, "I should look first."), (None, "Let me check.")]
    assert resp.function_calls and resp.function_calls[0].name == "run_shell_command"
    assert resp.function_calls[0].args == {"command": "ls -la"} and resp.function_calls[0].id == "chatcmpl-tool-1a2b3c"
    assert resp.candidates[0].finish_reason == types.FinishReason.STOP
    expected = scripted_completion(dialects_app.state.seen[0].canonical).usage
    assert resp.usage_metadata is not None and expected is not None
    assert (resp.usage_metadata.prompt_token_count, resp.usage_metadata.candidates_token_count) == (expected.prompt_tokens, expected.completion_tokens)
    assert resp.model_version == "gemini-2.5-pro"


async def test_sdk_stream_with_tools(dialects_app: FastAPI) -> None:
    config = types.GenerateContentConfig(tools=TOOLS)
    sdk = client(dialects_app)
    chunks = [c async for c in await sdk.aio.models.generate_content_stream(model="gemini-2.5-pro", contents="hi", config=config)]
    assert dialects_app.state.seen[0].stream
    text = "".join(p.text for c in chunks for p in (c.candidates[0].content.parts or []) if p.text and not p.thought)  # type: ignore[index,union-attr]
    assert text == "Let me check."
    calls = [fc for c in chunks for fc in (c.function_calls or [])]
    assert [(fc.name, fc.args) for fc in calls] == [("run_shell_command", {"command": "ls -la"})]
    last = chunks[-1]
    assert last.candidates and last.candidates[0].finish_reason == types.FinishReason.STOP
    assert last.usage_metadata is not None and last.usage_metadata.candidates_token_count == 12


async def test_max_tokens_finish(dialects_app: FastAPI) -> None:
    config = types.GenerateContentConfig(max_output_tokens=1)
    resp = await client(dialects_app).aio.models.generate_content(model="g", contents="hi", config=config)
    assert resp.candidates and resp.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS


async def test_count_tokens(dialects_app: FastAPI) -> None:
    counted = await client(dialects_app).aio.models.count_tokens(model="gemini-2.5-pro", contents="one two three")
    assert counted.total_tokens and counted.total_tokens > 0


async def test_training_refuses_mode_any(dialects_app: FastAPI) -> None:
    sdk = client(dialects_app, **{TRAINING_HEADER: "1"})
    any_mode = types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode=types.FunctionCallingConfigMode.ANY))
    with pytest.raises(errors.ClientError) as err:
        await sdk.aio.models.generate_content(model="g", contents="hi", config=types.GenerateContentConfig(tools=TOOLS, tool_config=any_mode))
    assert err.value.code == 400 and err.value.status == "INVALID_ARGUMENT"
    assert "forces a tool call" in (err.value.message or "")
    schema = types.GenerateContentConfig(response_mime_type="application/json", response_schema={"type": "OBJECT"})
    with pytest.raises(errors.ClientError, match="structured output"):
        await sdk.aio.models.generate_content(model="g", contents="hi", config=schema)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": ""}}]}]}, "text-only"),
        ({"contents": [{"role": "user", "parts": [{"text": "x"}]}], "generationConfig": {"candidateCount": 2}}, "candidateCount"),
        ({"contents": [{"role": "robot", "parts": [{"text": "x"}]}]}, "role"),
        ({"contents": "not a list"}, "contents"),
        ({"contents": []}, "empty"),
    ],
)
async def test_bad_requests_get_gemini_400s(dialects_app: FastAPI, body: dict[str, Any], needle: str) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=dialects_app), base_url="http://p") as http:
        resp = await http.post("/v1beta/models/g:generateContent", json=body, headers={"x-goog-api-key": "k"})
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert (err["code"], err["status"]) == (400, "INVALID_ARGUMENT") and needle in err["message"]


def test_calls_and_responses_pair_by_id_then_by_name() -> None:
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "go"}]},
            {"role": "model", "parts": [
                {"functionCall": {"name": "read", "args": {"p": "a"}, "id": "x1"}},
                {"functionCall": {"name": "read", "args": {"p": "b"}}},
                {"functionCall": {"name": "ls", "args": {}}},
            ]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "ls", "response": {"files": []}}},
                {"functionResponse": {"name": "read", "response": {"output": "B"}}},
                {"functionResponse": {"name": "read", "id": "x1", "response": {"output": "A"}}},
            ]},
        ]
    }
    messages = GeminiDialect().parse_request(body, ROUTE).canonical.messages
    ids = [c.id for c in messages[1].tool_calls or []]
    assert ids == ["x1", "call_2", "call_3"]
    assert [(m.tool_call_id, m.content) for m in messages[2:]] == [("call_3", '{"files":[]}'), ("call_2", "B"), ("x1", "A")]


async def test_mid_stream_failure_raises_in_the_sdk() -> None:
    dialect = GeminiDialect()
    parsed = dialect.parse_request({"contents": [{"parts": [{"text": "x"}]}]}, RouteInfo(dialect="gemini", model="g", stream=True))

    async def broken() -> AsyncIterator[CompletionChunk]:
        async for chunk in vllm_chunks(scripted_completion(parsed.canonical)):
            yield chunk
            raise DialectError("the engine stream broke", "upstream")

    data = b"".join([b async for b in dialect.render_stream(broken(), parsed)])

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=data, headers={"content-type": "text/event-stream"})

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    sdk = genai.Client(api_key="k", http_options=types.HttpOptions(base_url="http://p", httpx_async_client=http))
    with pytest.raises(errors.APIError, match="engine stream broke"):
        async for _ in await sdk.aio.models.generate_content_stream(model="g", contents="x"):
            pass
