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
from harnessrl.runtime.proxy.dialects.upstream import CompletionChunk, Usage


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
                ids = chunk.prompt_token_ids
                yield Started(len(ids) if ids is not None else None)
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices[:1]:
                delta = choice.delta
                if delta.reasoning_text:
                    yield ReasoningDelta(delta.reasoning_text)
                if delta.content:
                    yield TextDelta(delta.content)
                for pos, call in enumerate(delta.tool_calls or []):
                    index = call.index if call.index is not None else pos
                    fn = call.function
                    if index not in calls:
                        if fn is None or not fn.name:
                            pending_args[index] = pending_args.get(index, "") + ((fn.arguments or "") if fn else "")
                            continue
                        calls[index] = call.id or f"call_{index}"
                        yield ToolCallStart(index, calls[index], fn.name)
                        args = pending_args.pop(index, "") + (fn.arguments or "")
                    else:
                        args = (fn.arguments or "") if fn else ""
                    if args:
                        yield ToolArgsDelta(index, args)
                if choice.finish_reason:
                    finish = choice.finish_reason
                if isinstance(choice.stop_reason, str):
                    stop_sequence = choice.stop_reason
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
