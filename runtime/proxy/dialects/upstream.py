"""The upstream wire format: vLLM's OpenAI Chat Completions response and stream chunk.

These are the shapes the proxy parses from vLLM and hands to a dialect for rendering. They
are lenient (the completion keeps extra fields, a chunk drops them) because vLLM adds fields between releases;
the fields the dialects and the capture read are typed. vLLM 0.32 names the reasoning text `reasoning`;
older releases (and some OpenAI-compatible servers) say `reasoning_content`, so both are read.
`prompt_token_ids` is a list as parsed here, and an int32 array when the proxy read it knowing the session's
previous sequence (see prompt_prefix.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCallDelta(_Lenient):
    name: str | None = None
    arguments: str | None = None


class UpstreamToolCall(_Lenient):
    """A tool call; in a stream chunk every field but `index` may be missing."""

    id: str | None = None
    type: str | None = "function"
    index: int | None = None
    function: FunctionCallDelta | None = None


class UpstreamMessage(_Lenient):
    """`choices[i].message` of a completion, or `choices[i].delta` of a chunk."""

    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[UpstreamToolCall] | None = None

    @property
    def reasoning_text(self) -> str | None:
        return self.reasoning if self.reasoning is not None else self.reasoning_content


class TokenLogprob(TypedDict, total=False):
    """One sampled token's entry: only its logprob is read. A TypedDict, not a model, in whole completions too:
    validating one lenient model per token (with its text, bytes and top-logprob list kept) took half of a
    completion's parse."""

    logprob: float


class ChoiceLogprobs(_Lenient):
    content: list[TokenLogprob] | None = None


class Usage(_Lenient):
    prompt_tokens: int = 0
    completion_tokens: int | None = 0
    total_tokens: int = 0
    prompt_tokens_details: dict[str, Any] | None = None
    completion_tokens_details: dict[str, Any] | None = None

    @property
    def cached_tokens(self) -> int:
        return int((self.prompt_tokens_details or {}).get("cached_tokens") or 0)

    @property
    def output_tokens(self) -> int:
        return self.completion_tokens or 0


class Choice(_Lenient):
    index: int = 0
    message: UpstreamMessage = Field(default_factory=UpstreamMessage)
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class Completion(_Lenient):
    """A non-streaming `chat.completion` from vLLM (with `return_token_ids`)."""

    id: str = "chatcmpl-0"
    object: str = "chat.completion"
    created: int = 0
    model: str = ""
    choices: list[Choice] = Field(default_factory=list)
    usage: Usage | None = None
    prompt_token_ids: Sequence[int] | None = None


# A stream brings one chunk per token, so its chunks are validated as TypedDicts (pydantic, ~2.5 us) rather than
# as models (~6 us for the five objects a chunk becomes). Keys vLLM sends that no one reads are dropped.


class FunctionDelta(TypedDict, total=False):
    name: str | None
    arguments: str | None


class ToolCallDelta(TypedDict, total=False):
    """A tool call's piece in a chunk: the first has `id` and the function's name, later ones argument text."""

    id: str | None
    index: int | None
    function: FunctionDelta | None


class ChunkDelta(TypedDict, total=False):
    role: str | None
    content: str | None
    reasoning: str | None
    reasoning_content: str | None
    tool_calls: list[ToolCallDelta] | None


class ChunkLogprobs(TypedDict, total=False):
    content: list[TokenLogprob] | None


class ChunkChoice(TypedDict, total=False):
    index: int
    delta: ChunkDelta
    logprobs: ChunkLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None
    token_ids: list[int] | None


class CompletionChunk(TypedDict, total=False):
    """One `chat.completion.chunk` of a vLLM stream. With `stream_options.include_usage` the
    last chunk has `choices == []` and `usage` set; `prompt_token_ids` comes on the first."""

    choices: list[ChunkChoice]
    usage: Usage | None
    prompt_token_ids: Sequence[int] | None


STREAM_CHUNK: TypeAdapter[CompletionChunk] = TypeAdapter(CompletionChunk)


def reasoning_of(delta: ChunkDelta) -> str | None:
    """A chunk's reasoning text, by the same rule as `UpstreamMessage.reasoning_text`."""
    reasoning = delta.get("reasoning")
    return reasoning if reasoning is not None else delta.get("reasoning_content")
