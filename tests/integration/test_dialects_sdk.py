"""The official SDKs over a real socket against the dialect layer: the stand-in app of
tests/fixtures/dialects_app.py runs under uvicorn on 127.0.0.1 in a child process, in front of a
canned engine that answers in vLLM's shape (the real proxy in front of real vLLM is tested by
the proxy's own integration tests). Each SDK runs a whole tool loop, streaming and not: the
model calls a tool, the caller sends the result back, the model answers in text."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

pytestmark = pytest.mark.timeout(120)

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_tool_loop(dialects_server: str, stream: bool) -> None:
    sdk = openai.OpenAI(api_key="sess-chat", base_url=f"{dialects_server}/v1", max_retries=0)
    tools: Any = [{"type": "function", "function": {"name": "run", "parameters": SCHEMA}}]
    messages: list[Any] = [{"role": "user", "content": "list files"}]

    def ask() -> Any:
        if not stream:
            return sdk.chat.completions.create(model="m", messages=messages, tools=tools).choices[0]
        with sdk.chat.completions.stream(model="m", messages=messages, tools=tools) as s:
            return s.get_final_completion().choices[0]

    first = ask()
    assert first.finish_reason == "tool_calls"
    call = first.message.tool_calls[0]
    assert call.function.name == "run" and call.function.arguments == '{"command": "ls -la"}'
    messages += [first.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": [{"type": "text", "text": "a.txt"}]}]
    second = ask()
    assert second.finish_reason == "stop" and second.message.content == "Done. Last input: a.txt"


@pytest.mark.parametrize("stream", [False, True])
def test_openai_responses_tool_loop(dialects_server: str, stream: bool) -> None:
    sdk = openai.OpenAI(api_key="sess-resp", base_url=f"{dialects_server}/v1", max_retries=0)
    tools: Any = [{"type": "function", "name": "run", "parameters": SCHEMA, "strict": False}, {"type": "web_search"}]
    items: list[Any] = [{"role": "user", "content": "list files"}]

    def ask() -> Any:
        if not stream:
            return sdk.responses.create(model="m", input=items, tools=tools, store=False)
        with sdk.responses.stream(model="m", input=items, tools=tools, store=False) as s:
            return s.get_final_response()

    first = ask()
    call = first.output[-1]
    assert call.type == "function_call" and call.name == "run"
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"})
    second = ask()
    assert second.status == "completed" and second.output_text == "Done. Last input: a.txt"


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_tool_loop(dialects_server: str, stream: bool) -> None:
    sdk = anthropic.Anthropic(api_key="sess-anthropic", base_url=dialects_server, max_retries=0)
    tools: Any = [{"name": "run", "input_schema": SCHEMA}, {"type": "web_search_20250305", "name": "web_search"}]
    messages: list[Any] = [{"role": "user", "content": "list files"}]

    def ask() -> Any:
        if not stream:
            return sdk.messages.create(model="m", max_tokens=100, messages=messages, tools=tools)
        with sdk.messages.stream(model="m", max_tokens=100, messages=messages, tools=tools) as s:
            return s.get_final_message()

    first = ask()
    assert first.stop_reason == "tool_use"
    call = first.content[-1]
    assert call.type == "tool_use" and call.input == {"command": "ls -la"}
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a.txt"}]},
    ]
    second = ask()
    assert second.stop_reason == "end_turn" and second.content[-1].text == "Done. Last input: a.txt"


@pytest.mark.parametrize("stream", [False, True])
def test_gemini_tool_loop(dialects_server: str, stream: bool) -> None:
    sdk = genai.Client(api_key="sess-gemini", http_options=types.HttpOptions(base_url=dialects_server))
    decl = types.FunctionDeclaration(name="run", parameters_json_schema=SCHEMA)
    config = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[decl])])
    contents: list[Any] = [types.Content(role="user", parts=[types.Part(text="list files")])]

    def ask() -> tuple[list[types.Part], list[types.FunctionCall], Any]:
        if not stream:
            resp = sdk.models.generate_content(model="g", contents=contents, config=config)
            chunks = [resp]
        else:
            chunks = list(sdk.models.generate_content_stream(model="g", contents=contents, config=config))
        parts = [p for c in chunks for p in (c.candidates[0].content.parts or [])]  # type: ignore[index,union-attr]
        calls = [fc for c in chunks for fc in (c.function_calls or [])]
        return parts, calls, chunks[-1].candidates[0].finish_reason  # type: ignore[index]

    parts, calls, finish = ask()
    assert [(fc.name, fc.args) for fc in calls] == [("run", {"command": "ls -la"})] and finish == types.FinishReason.STOP
    contents += [
        types.Content(role="model", parts=parts),
        types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(name="run", id=calls[0].id, response={"output": "a.txt"}))]),
    ]
    parts, calls, finish = ask()
    assert not calls and "".join(p.text or "" for p in parts if not p.thought) == "Done. Last input: a.txt"
