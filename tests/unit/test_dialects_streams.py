"""Streaming and non-streaming agree, as the official SDKs read them: for any completion (text,
reasoning, tool calls, finish reason) cut into vLLM-style chunks at any points, each dialect's
SSE stream accumulated by its SDK equals its non-streaming response parsed by the same SDK."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import httpx2
import openai
from google import genai
from google.genai import types as gtypes
from harnessrl.runtime.proxy.dialects.routes import DIALECTS, match_route
from harnessrl.runtime.proxy.dialects.upstream import STREAM_CHUNK, Completion, CompletionChunk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState

REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "openai_chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}),
    "openai_responses": ("/v1/responses", {"model": "m", "input": "x", "stream": True}),
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}], "stream": True}),
    "gemini": ("/v1beta/models/m:streamGenerateContent", {"contents": [{"parts": [{"text": "x"}]}]}),
}

text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20)
arguments = st.dictionaries(st.sampled_from(["path", "command", "n"]), st.integers(0, 9) | text, max_size=2)


@st.composite
def cases(draw: st.DrawFn) -> tuple[Completion, list[int]]:
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": draw(st.sampled_from(["read", "run"])), "arguments": json.dumps(draw(arguments))}}
        for i in range(draw(st.integers(0, 2)))
    ]
    content = draw(st.none() | text.filter(bool))
    if content is None and not calls:
        content = "ok"
    finish = "tool_calls" if calls else draw(st.sampled_from(["stop", "length"]))
    message = {"role": "assistant", "content": content, "reasoning": draw(st.none() | text.filter(bool)), "tool_calls": calls}
    completion = Completion.model_validate(
        {
            "id": "chatcmpl-1",
            "model": "served",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
            "prompt_token_ids": [1, 2, 3, 4, 5],
        }
    )
    return completion, draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))


def _cut(value: str, sizes: list[int]) -> list[str]:
    pieces, i, k = [], 0, 0
    while i < len(value):
        size = sizes[k % len(sizes)]
        pieces.append(value[i : i + size])
        i, k = i + size, k + 1
    return pieces


async def _chunks(completion: Completion, sizes: list[int]) -> AsyncIterator[CompletionChunk]:
    """vLLM's chunking: role + prompt ids, then pieces; a tool call's head, then its arguments."""
    head = {"id": completion.id, "model": completion.model}
    choice = completion.choices[0]
    msg = choice.message

    def chunk(delta: dict[str, Any], **extra: Any) -> CompletionChunk:
        return STREAM_CHUNK.validate_python({**head, "choices": [{"index": 0, "delta": delta, **extra}], **extra.pop("top", {})})

    yield STREAM_CHUNK.validate_python({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "prompt_token_ids": completion.prompt_token_ids})
    for piece in _cut(msg.reasoning_text or "", sizes):
        yield chunk({"reasoning": piece})
    for piece in _cut(msg.content or "", sizes):
        yield chunk({"content": piece})
    for i, call in enumerate(msg.tool_calls or []):
        assert call.function is not None
        yield chunk({"tool_calls": [{"index": i, "id": call.id, "type": "function", "function": {"name": call.function.name}}]})
        for piece in _cut(call.function.arguments or "", sizes):
            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    yield chunk({}, finish_reason=choice.finish_reason)
    yield STREAM_CHUNK.validate_python({**head, "choices": [], "usage": completion.usage.model_dump() if completion.usage else None})


def _serve(name: str, completion: Completion, sizes: list[int]) -> dict[str, Any]:
    """Render the stream into what the SDK clients will be answered; return the non-stream body."""
    path, body = REQUESTS[name]
    route = match_route(path)
    assert route is not None
    dialect = DIALECTS[name]
    parsed = dialect.parse_request(body, route)

    async def drain() -> bytes:
        return b"".join([b async for b in dialect.render_stream(_chunks(completion, sizes), parsed)])

    _SSE["data"] = asyncio.run(drain())
    return dialect.render_response(completion, parsed)


# Each SDK client is built once (building one per example is slow); its transport answers every
# request with the SSE bytes of the current example.
_SSE = {"data": b""}
_HEADERS = {"content-type": "text/event-stream"}


@functools.cache
def _openai() -> openai.OpenAI:
    transport = httpx2.MockTransport(lambda _: httpx2.Response(200, content=_SSE["data"], headers=_HEADERS))
    return openai.OpenAI(api_key="k", base_url="http://p/v1", http_client=httpx2.Client(transport=transport))


@functools.cache
def _anthropic() -> anthropic.Anthropic:
    transport = httpx2.MockTransport(lambda _: httpx2.Response(200, content=_SSE["data"], headers=_HEADERS))
    return anthropic.Anthropic(api_key="k", base_url="http://p", http_client=httpx2.Client(transport=transport))


@functools.cache
def _gemini() -> genai.Client:
    transport = httpx.MockTransport(lambda _: httpx.Response(200, content=_SSE["data"], headers=_HEADERS))
    options = gtypes.HttpOptions(base_url="http://p", httpx_client=httpx.Client(transport=transport))
    return genai.Client(api_key="k", http_options=options)


EXAMPLES = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@EXAMPLES
@given(case=cases())
def test_openai_chat(case: tuple[Completion, list[int]]) -> None:
    body = _serve("openai_chat", *case)
    sdk = _openai()
    # The SDK's own accumulator (its `.stream()` helper raises on finish_reason "length").
    state = ChatCompletionStreamState()
    for chunk in sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True):
        state.handle_chunk(chunk)
    streamed = state.current_completion_snapshot.choices[0]
    whole = openai.types.chat.ChatCompletion.model_validate(body).choices[0]
    assert streamed.finish_reason == whole.finish_reason
    assert (streamed.message.content or "") == (whole.message.content or "")
    got = [(c.id, c.function.name, c.function.arguments) for c in streamed.message.tool_calls or []]
    assert got == [(c.id, c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]  # type: ignore[union-attr]


def _items(output: list[Any]) -> list[Any]:
    return [item.model_dump(exclude={"id", "status"}, exclude_none=True) for item in output]


@EXAMPLES
@given(case=cases())
def test_openai_responses(case: tuple[Completion, list[int]]) -> None:
    body = _serve("openai_responses", *case)
    sdk = _openai()
    # The last event carries the final response: response.completed, or response.incomplete
    # (which the SDK's `.stream()` helper does not accept as an end, though the API sends it).
    events = list(sdk.responses.create(model="m", input="x", stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete")
    streamed = events[-1].response
    whole = openai.types.responses.Response.model_validate(body)
    assert streamed.status == whole.status and streamed.output_text == whole.output_text
    assert _items(streamed.output) == _items(whole.output)
    assert streamed.usage == whole.usage
    # The deltas add up to the final items.
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert reasoning == "".join(c.text for i in whole.output if i.type == "reasoning" for c in i.content or [])
    args: dict[str, str] = {}
    for e in events:
        if e.type == "response.function_call_arguments.delta":
            args[e.item_id] = args.get(e.item_id, "") + e.delta
    assert list(args.values()) == [i.arguments for i in whole.output if i.type == "function_call" and i.arguments]
    if streamed.status == "completed":  # the SDK's own accumulator agrees too
        with sdk.responses.stream(model="m", input="x") as stream:
            assert _items(stream.get_final_response().output) == _items(whole.output)


@EXAMPLES
@given(case=cases())
def test_anthropic(case: tuple[Completion, list[int]]) -> None:
    body = _serve("anthropic", *case)
    sdk = _anthropic()
    with sdk.messages.stream(model="m", max_tokens=9, messages=[{"role": "user", "content": "x"}]) as stream:
        streamed = stream.get_final_message()
    whole = anthropic.types.Message.model_validate(body)
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in whole.content]
    assert (streamed.stop_reason, streamed.usage.input_tokens, streamed.usage.output_tokens) == (
        whole.stop_reason, whole.usage.input_tokens, whole.usage.output_tokens)


@EXAMPLES
@given(case=cases())
def test_gemini(case: tuple[Completion, list[int]]) -> None:
    body = _serve("gemini", *case)
    sdk = _gemini()
    chunks = list(sdk.models.generate_content_stream(model="m", contents="x"))
    whole = gtypes.GenerateContentResponse.model_validate(body)

    def merged(responses: list[gtypes.GenerateContentResponse]) -> tuple[str, str, list[Any]]:
        parts = [p for r in responses for p in (r.candidates[0].content.parts or [])]  # type: ignore[index,union-attr]
        thought = "".join(p.text or "" for p in parts if p.thought)
        answer = "".join(p.text or "" for p in parts if not p.thought)
        calls = [(p.function_call.id, p.function_call.name, p.function_call.args) for p in parts if p.function_call]
        return thought, answer, calls

    assert merged(chunks) == merged([whole])
    assert chunks[-1].candidates[0].finish_reason == whole.candidates[0].finish_reason  # type: ignore[index]
    assert chunks[-1].usage_metadata == whole.usage_metadata
