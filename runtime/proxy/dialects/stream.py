"""vLLM's Chat Completions chunks as a flat sequence of typed stream events.

Every dialect renders the same few things from a stream: reasoning text, answer text, tool
calls (start, argument text), the finish reason and usage. `stream_events` reads them out of
the upstream chunks (choice 0; the proxy always asks for n=1) so a renderer is a small state
machine over these events. A `DialectError` raised by the upstream iterator mid-stream becomes a
`Failed` event, which each dialect renders as its own in-stream error.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from harnessrl.runtime.proxy.dialects.base import DialectError
from harnessrl.runtime.proxy.dialects.upstream import CompletionChunk, Usage, reasoning_of


@dataclass(frozen=True)
class Started:
    """The first upstream chunk arrived; `prompt_tokens` is known when vLLM sent the prompt ids."""

    prompt_tokens: int | None


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolArgsDelta:
    index: int
    text: str


@dataclass(frozen=True)
class Finished:
    """The end of the stream: `reason` is the upstream finish_reason (None if it never came)."""

    reason: str | None
    usage: Usage
    stop_sequence: str | None = None  # the stop string that ended it, when vLLM names one


@dataclass(frozen=True)
class Failed:
    error: DialectError


StreamEvent = Started | ReasoningDelta | TextDelta | ToolCallStart | ToolArgsDelta | Finished | Failed


async def stream_events(chunks: AsyncIterator[CompletionChunk]) -> AsyncIterator[StreamEvent]:
    """Typed events from upstream chunks: `Started` once the first chunk is in, then deltas, and
    always exactly one `Finished` or `Failed` at the end."""
    finish: str | None = None
    stop_sequence: str | None = None
    started = False
    usage = Usage()
    calls: dict[int, str] = {}  # upstream tool index -> id, once its name is known
    pending_args: dict[int, str] = {}  # argument text that came before the name
    try:
        async for chunk in chunks:
            if not started:
                started = True
                ids = chunk.get("prompt_token_ids")
                yield Started(len(ids) if ids is not None else None)
            chunk_usage = chunk.get("usage")
            if chunk_usage is not None:
                usage = chunk_usage
            for choice in chunk.get("choices", ())[:1]:
                delta = choice.get("delta") or {}
                reasoning = reasoning_of(delta)
                if reasoning:
                    yield ReasoningDelta(reasoning)
                content = delta.get("content")
                if content:
                    yield TextDelta(content)
                for pos, call in enumerate(delta.get("tool_calls") or ()):
                    index = call.get("index")
                    if index is None:
                        index = pos
                    fn = call.get("function") or {}
                    name, arguments = fn.get("name"), fn.get("arguments") or ""
                    if index not in calls:
                        if not name:
                            pending_args[index] = pending_args.get(index, "") + arguments
                            continue
                        calls[index] = call.get("id") or f"call_{index}"
                        yield ToolCallStart(index, calls[index], name)
                        arguments = pending_args.pop(index, "") + arguments
                    if arguments:
                        yield ToolArgsDelta(index, arguments)
                finish_reason = choice.get("finish_reason")
                if finish_reason:
                    finish = finish_reason
                stop_reason = choice.get("stop_reason")
                if isinstance(stop_reason, str):
                    stop_sequence = stop_reason
    except DialectError as exc:
        yield Failed(exc)
        return
    if not started:
        yield Started(None)
    yield Finished(finish, usage, stop_sequence)


def parse_arguments(arguments: str | None) -> dict[str, Any]:
    """Tool-call arguments as the JSON object Anthropic and Gemini want. A model that wrote
    invalid JSON gets `{}` so the harness answers with its own missing-parameter error."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
