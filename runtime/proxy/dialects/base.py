"""The contract between the capture proxy and its four API dialects.

The proxy receives a request in one of four dialects (OpenAI Chat Completions, OpenAI
Responses, Anthropic Messages, Gemini generateContent), asks the dialect to `parse_request`
it into one `CanonicalRequest` (exactly the Chat Completions body sent upstream to vLLM, before
the proxy adds its own sampling fields), sends that upstream, and asks the same dialect to
`render_response` / `render_stream` vLLM's answer (`upstream.Completion` / `CompletionChunk`)
back in the caller's format. Every refusal is a `DialectError`, which the dialect renders in
its own error shape (`render_error`), so the harness sees errors as its provider would send them.

Routing (path -> dialect, operation, streaming) and the session key live in `routes.py`.
"""

from __future__ import annotations

import json
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Generic, Literal, TypeVar, cast

from harnessrl.runtime.proxy.dialects import shared_tools
from harnessrl.runtime.proxy.dialects.history_bytes import SeenHistory, read_extension, seen_history
from harnessrl.runtime.proxy.dialects.upstream import (
    Choice,
    Completion,
    CompletionChunk,
    FunctionCallDelta,
    ToolCallDelta,
    UpstreamMessage,
    Usage,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import from_json

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
C = TypeVar("C")

# --------------------------------------------------------------------------- errors

ErrorKind = Literal[
    "invalid_request",  # 400: malformed JSON, wrong types, unsupported feature
    "authentication",  # 401: missing or unknown session key
    "permission",  # 403
    "not_found",  # 404: unknown path or model
    "too_large",  # 413: body over the limit
    "rate_limit",  # 429: per-session or global admission limit (with Retry-After)
    "overloaded",  # 503/529: upstream saturated (with Retry-After)
    "timeout",  # 504: upstream did not answer in time
    "upstream",  # 502: upstream answered with garbage or an unexpected error
    "internal",  # 500
]

DEFAULT_STATUS: dict[str, int] = {
    "invalid_request": 400,
    "authentication": 401,
    "permission": 403,
    "not_found": 404,
    "too_large": 413,
    "rate_limit": 429,
    "overloaded": 503,
    "timeout": 504,
    "upstream": 502,
    "internal": 500,
}


class DialectError(Exception):
    """A refusal to be answered in the caller's dialect.

    `status` is the HTTP status (defaults by `kind`); `retry_after` (seconds) becomes a
    `Retry-After` header; `param` names the offending field where one is known.
    """

    def __init__(
        self,
        message: str,
        kind: ErrorKind = "invalid_request",
        status: int | None = None,
        *,
        retry_after: float | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind: ErrorKind = kind
        self.status = status if status is not None else DEFAULT_STATUS[kind]
        self.retry_after = retry_after
        self.param = param


class ErrorResponse(BaseModel):
    """What the proxy sends for a `DialectError`: status, JSON body, extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = Field(default_factory=dict)


def error_headers(error: DialectError) -> dict[str, str]:
    if error.retry_after is None:
        return {}
    return {"retry-after": str(max(1, round(error.retry_after)))}


# ------------------------------------------------------------------ canonical request


class _Wire(BaseModel):
    """Canonical wire models: unknown fields are refused so a dialect cannot leak junk upstream."""

    model_config = ConfigDict(extra="forbid")


class TextPart(_Wire):
    type: Literal["text"] = "text"
    text: str


class FunctionCall(_Wire):
    name: str
    arguments: str = "{}"  # a JSON object as text, as Chat Completions sends it


class ToolCall(_Wire):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Wire):
    """One Chat Completions message. Reasoning from earlier turns is not carried: the chat
    templates of the models we train drop it from history anyway."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionDefinition(_Wire):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionTool(_Wire):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Wire):
    name: str


class NamedToolChoice(_Wire):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice
ToolChoiceMode = Literal["auto", "none", "required"]
TOOL_CHOICE_MODES: dict[str, ToolChoiceMode] = {"auto": "auto", "none": "none", "required": "required"}


class CanonicalRequest(BaseModel):
    """The Chat Completions body the proxy sends to vLLM (before it adds logprobs,
    return_token_ids and resets sampling knobs). Extra fields are allowed so an OpenAI Chat
    caller's vLLM-specific fields (e.g. `guided_json`) reach `constrained_decoding_reasons`."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[ChatMessage]
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    stream: bool = False
    n: Literal[1] = 1
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None

    def upstream_body(self) -> dict[str, Any]:
        """The JSON body for vLLM; unset optional fields are left out."""
        return self.model_dump(mode="json", exclude_none=True)


class Operation(StrEnum):
    GENERATE = "generate"
    COUNT_TOKENS = "count_tokens"  # the proxy tokenizes `canonical` instead of generating


class ToolOrigin(BaseModel):
    """What a canonical function name was in the caller's dialect, for rendering calls back:
    Responses `namespace` tools are flattened to `{namespace}__{name}` and `custom` (free-text)
    tools become a function with one string argument `input`."""

    name: str
    namespace: str | None = None
    kind: Literal["function", "custom"] = "function"


class ParsedRequest(BaseModel):
    """A dialect's reading of a request: the canonical body plus what is not sent upstream but
    the renderers need (the model name to echo, where each tool came from)."""

    canonical: CanonicalRequest
    operation: Operation = Operation.GENERATE
    stream: bool = False  # whether the caller wants SSE back
    requested_model: str  # echoed back in responses
    stream_usage: bool = False  # OpenAI Chat `stream_options.include_usage`: a usage chunk at the end
    tool_origins: dict[str, ToolOrigin] = Field(default_factory=dict)  # only names that differ
    dropped_tools: list[str] = Field(default_factory=list)  # hosted tools left out, for logs/metrics


# ------------------------------------------------------------- constrained decoding

# vLLM-specific request fields that constrain sampling (all would change the distribution the
# engine samples from, so the recorded logprobs would no longer be the policy's).
CONSTRAINING_EXTRAS = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_whitespace_pattern",
    "guided_decoding_backend",
    "structured_outputs",
    "structural_tag",
    "allowed_token_ids",
    "bad_words",
    "logits_processors",
    "min_tokens",
)


def constrained_decoding_reasons(request: CanonicalRequest) -> list[str]:
    """Why this request would not sample from the full policy distribution (empty if it would).

    Every dialect maps its own knobs onto the canonical fields (Anthropic `tool_choice: any/tool`
    and Gemini `mode: ANY` become `required` / a named function; Gemini `responseSchema` becomes
    `response_format`), so one check covers all four.
    """
    reasons: list[str] = []
    if request.logit_bias:
        reasons.append("logit_bias")
    if request.response_format and request.response_format.get("type") not in (None, "text"):
        reasons.append(f"response_format of type {request.response_format.get('type')!r} (structured output)")
    extras = request.model_extra or {}
    reasons += [f"{name} (guided decoding)" for name in CONSTRAINING_EXTRAS if extras.get(name) is not None]
    if request.tool_choice == "required":
        reasons.append("tool_choice that forces a tool call")
    elif isinstance(request.tool_choice, NamedToolChoice):
        reasons.append(f"tool_choice that forces the tool {request.tool_choice.function.name!r}")
    return reasons


def reject_constrained_decoding(request: CanonicalRequest) -> None:
    """Raise the 400 a training session gets for constrained decoding (the proxy decides when)."""
    reasons = constrained_decoding_reasons(request)
    if reasons:
        raise DialectError(
            "this is an RL training session: constrained decoding is not allowed because it changes the "
            "sampling distribution; remove " + ", ".join(reasons)
        )


# ------------------------------------------------------------------- helpers


MAX_JSON_DEPTH = 64  # deeper bodies are refused before any recursive code walks them


def _depth_ok(value: dict[str, Any], checked: Container[str] = ()) -> bool:
    """Whether `value` nests at most MAX_JSON_DEPTH levels; its members named in `checked` are not walked."""
    # Only containers go on the stack: a request is mostly strings, and this runs on every call.
    stack: list[tuple[Any, int]] = [(v, 2) for k, v in value.items() if isinstance(v, (dict, list)) and k not in checked]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return False
        children = item.values() if isinstance(item, dict) else item
        stack += [(v, depth + 1) for v in children if isinstance(v, (dict, list))]  # a tuple: faster than a union
    return True


class HistoryMemo:
    """A session's previous request in one dialect: its body's bytes (`SeenHistory`, history_bytes.py), the
    canonical messages its history's items became, and the dialect's conversion state after them (e.g. Gemini's
    open tool calls; None when items convert independently). Harnesses resend the whole conversation every turn,
    so when a body starts with the previous one's history byte for byte and goes on with more items, only the text
    after them is parsed, and only the new items are checked, validated and converted: parsing costs O(new items),
    not O(history). A dialect whose items convert independently also gives `marks` (how many canonical messages
    the first 1, 2, ... items became), and then a body that rewrote its last items (Claude Code's sliding
    `cache_control` marker) reuses the items before the first rewritten one. One per session, owned by the
    proxy."""

    __slots__ = ("_last", "tools")

    def __init__(self) -> None:
        # One object, replaced whole, so a parse in a worker thread always reads a consistent memo.
        self._last: _Remembered | None = None
        self.tools: ToolsMemo | None = None

    def read(self, dialect: str, body: bytes, key: str) -> MemoRead:
        """The body's object, with `key` cut to the items it shares with the previous request when it extends
        them; a full parse otherwise."""
        last = self._last
        if last is not None and last.dialect == dialect:
            extended = read_extension(body, key, last.seen, partial=last.marks is not None)
            if extended is not None:
                data, seen, reused = extended
                checked = _reused_members(last.seen, seen)
                if reused == last.seen.count:
                    return MemoRead(data, reused, last.messages, last.state, seen, last.marks, checked)
                assert last.marks is not None  # a partial read is asked for only with marks
                marks = last.marks[:reused]
                return MemoRead(data, reused, last.messages[: marks[-1]], None, seen, marks, checked)
        data = load_json_object(body, check_depth=False)
        return MemoRead(data, 0, [], None, seen_history(body, data, key), (), ())

    def remember(
        self,
        dialect: str,
        seen: SeenHistory | None,
        messages: list[ChatMessage],
        state: Any = None,
        marks: tuple[int, ...] | None = None,
    ) -> None:
        self._last = None if seen is None else _Remembered(dialect, seen, messages, state, marks)


def _reused_members(before: SeenHistory, now: SeenHistory) -> set[str]:
    """The members of a body read through the memo whose values are the previous body's objects: those before its
    history, and those after it when they are the same bytes."""
    tail = now.tail[1] if now.tail is not None and before.tail is not None and now.tail[1] is before.tail[1] else {}
    return {*now.head, *tail}


@dataclass(frozen=True, slots=True)
class ToolsMemo:
    """A request's `tools` member as parsed (`raw`), validated and converted by its dialect. Harnesses send
    the same tools on every call (a captured Claude Code request carried 30 definitions, tens of KB), and a
    body read through the memo holds the very object the previous body's parse made for a member before or
    after its history, so `raw is` the new body's member means the same JSON: its validation, conversion and
    upstream JSON are reused instead of being made again on every call. Sessions with the same tools share one
    parsed, validated and converted copy (shared_tools.py)."""

    raw: Any
    validated: Any
    converted: Any


@dataclass(frozen=True, slots=True)
class _Remembered:
    dialect: str
    seen: SeenHistory
    messages: list[ChatMessage]
    state: Any
    marks: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class MemoRead:
    """A body as `HistoryMemo.read` gave it: the object (its history cut to the `seen` items it shares with the
    previous request's), the canonical messages of the cut items and the conversion state after them, what to
    remember of this body for the next one, and the cut items' marks (None from a dialect that gives none)."""

    data: dict[str, Any]
    seen: int
    known: list[ChatMessage]
    state: Any
    history: SeenHistory | None
    marks: tuple[int, ...] | None
    checked: Container[str]  # members that are the previous body's objects, checked when first parsed


class EncodedMessages:
    """A session's last upstream `messages` and each one's JSON. The canonical messages of a request's seen history
    are the very objects the previous request's were (`HistoryMemo`, never changed), so only the messages after
    them are encoded: building the engine's body costs O(new messages), not O(history). One per session, used on
    the event loop only."""

    __slots__ = ("_messages", "_pieces", "reused")

    def __init__(self) -> None:
        self._messages: list[ChatMessage] = []
        self._pieces: list[bytes] = []
        self.reused = 0  # how many leading messages the last `encode` took from the call before

    def encode(self, messages: list[ChatMessage]) -> bytes:
        """`messages` as the items of a JSON array (without its brackets: the caller's one join adds them), as
        `model_dump(mode="json", exclude_none=True)` then encoding would give."""
        old = self._messages
        same = 0
        for new, was in zip(messages, old, strict=False):
            if new is not was and new != was:  # a system prompt is made anew each call, equal to the last one
                break
            same += 1
        pieces = self._pieces[:same]
        pieces += [m.__pydantic_serializer__.to_json(m, exclude_none=True) for m in messages[same:]]
        self._messages, self._pieces, self.reused = list(messages), pieces, same
        return b",".join(pieces)


@dataclass(frozen=True)
class MemoParsed(Generic[M]):
    """A request validated by `parse_with_memo`: `request` holds only the history items after the first `seen`,
    which became `known` canonical messages, leaving the dialect's conversion in `state` (see `HistoryMemo`);
    `history` is what to remember of the body, `marks` the seen items' marks."""

    request: M
    history: SeenHistory | None
    seen: int
    known: list[ChatMessage]
    state: Any
    marks: tuple[int, ...] | None = ()
    memo: HistoryMemo | None = None
    raw_tools: Any = None  # the body's `tools` member as parsed

    def convert_tools(self, tools: Any, convert: Callable[[Any], C]) -> C:
        """`convert(tools)`, the validated `tools` member, or what it gave for the same tools on the previous call."""
        known = self.memo.tools if self.memo is not None else None
        if known is not None and tools is not None and tools is known.validated:
            return cast(C, known.converted)
        converted = convert(tools)
        if self.memo is not None:
            if self.raw_tools is None:
                self.memo.tools = None
            else:
                raw, validated, converted = shared_tools.share(convert, self.raw_tools, tools, converted)
                if self.history is not None:
                    self.history.adopt("tools", raw)
                self.memo.tools = ToolsMemo(raw, validated, converted)
        return converted

    def remember(
        self,
        memo: HistoryMemo | None,
        dialect: str,
        messages: list[ChatMessage],
        state: Any = None,
        marks: tuple[int, ...] | None = None,
    ) -> None:
        """Record the whole history's canonical `messages` (and the state after them, or each item's mark) for
        the next call."""
        if memo is not None:
            memo.remember(dialect, self.history, messages, state, marks)

    def convert_items(
        self, items: Sequence[T], convert: Callable[[T, str], list[ChatMessage]], key: str
    ) -> tuple[list[ChatMessage], tuple[int, ...]]:
        """The canonical messages of the whole history, for a dialect whose items convert independently
        (`convert(item, where)`): the known ones, then those of `items` (the items after the first `seen`), and
        every item's mark."""
        messages = list(self.known)
        marks = list(self.marks or ())
        for i, item in enumerate(items, self.seen):
            messages += convert(item, f"{key}.{i}")
            marks.append(len(messages))
        return messages, tuple(marks)


def parse_with_memo(
    body: bytes | Mapping[str, Any], model: type[M], key: str, memo: HistoryMemo | None, dialect: str
) -> MemoParsed[M]:
    """Load, depth-check and validate a request, skipping the leading items of its history list `data[key]`
    that `memo` has seen (they were checked when they were first seen); errors name indices as sent."""
    if memo is None or not isinstance(body, bytes):
        data = load_json_object(body, check_depth=False)
        check_depth_of(data)
        return MemoParsed(validate_body(model, data), None, 0, [], None)
    read = memo.read(dialect, body, key)
    check_depth_of(read.data, read.checked)
    raw_tools = read.data.get("tools")
    tools = memo.tools
    if tools is None or raw_tools is None or raw_tools is not tools.raw:
        request = validate_body(model, read.data, (key, read.seen))
    else:  # the same tools as the previous call's: validated then
        request = validate_body(model, {k: v for k, v in read.data.items() if k != "tools"}, (key, read.seen))
        request.tools = tools.validated  # type: ignore[attr-defined]  # every dialect's request has `tools`
    return MemoParsed(request, read.history, read.seen, read.known, read.state, read.marks, memo, raw_tools)


def load_json_object(body: bytes | str | Mapping[str, Any], *, check_depth: bool = True) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 that says what is wrong with it. Without `check_depth` the
    caller must call `check_depth_of` itself (after cutting what it has already checked)."""
    if isinstance(body, Mapping):
        data: Any = dict(body)
    else:
        try:
            # pydantic-core's parser reads a long history ~2.5x faster than json.loads; on anything it refuses,
            # json.loads decides, so what is accepted and the errors are json.loads's.
            data = from_json(body)
        except ValueError:
            try:
                data = json.loads(body)
            except (UnicodeDecodeError, ValueError, RecursionError) as exc:
                reason = "it is nested too deeply" if isinstance(exc, RecursionError) else str(exc)
                raise DialectError(f"request body is not valid JSON: {reason}") from None
    if not isinstance(data, dict):
        raise DialectError(f"request body must be a JSON object, not {type(data).__name__}")
    if check_depth:
        check_depth_of(data)
    return data


def check_depth_of(data: dict[str, Any], checked: Container[str] = ()) -> None:
    if not _depth_ok(data, checked):
        raise DialectError(f"request body is nested more than {MAX_JSON_DEPTH} levels deep")


def validate_body(model: type[M], data: Mapping[str, Any], cut: tuple[str, int] = ("", 0)) -> M:
    """Validate a dialect's request model; pydantic's errors become one readable 400. `cut` = (history key,
    number of leading items cut from it by `parse_with_memo`), so an error names the item's index in the
    request the harness sent."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = list(first["loc"])
        if cut[1] and len(loc) > 1 and loc[0] == cut[0] and isinstance(loc[1], int):
            loc[1] += cut[1]
        where = ".".join(str(p) for p in loc) or "body"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise DialectError(f"invalid request: {where}: {first['msg']}{more}", param=where) from None


def as_object(value: Any, where: str) -> Mapping[str, Any]:
    """A nested JSON object the request model left untyped, or a 400 naming where it is not one."""
    if not isinstance(value, Mapping):
        raise DialectError(f"invalid request: {where} must be an object", param=where)
    return value


def unsupported_content(kind: str, where: str) -> DialectError:
    """The 400 for images, audio and files: the models trained here are text-only."""
    return DialectError(
        f"content of type {kind!r} is not supported: the served model is text-only", param=where
    )


def join_text(parts: list[TextPart]) -> str | list[TextPart]:
    """One text part as a plain string (what most callers send); several stay parts."""
    return parts[0].text if len(parts) == 1 else parts


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def final_completion(text: str, model: str, finish_reason: str = "stop") -> Completion:
    """A synthetic completion the proxy answers with to end an episode gracefully (call budget
    exhausted, context length exceeded): plain text and no tool call, so every harness stops."""
    return Completion(
        id=new_id("chatcmpl-"),
        created=int(time.time()),
        model=model,
        choices=[Choice(message=UpstreamMessage(role="assistant", content=text), finish_reason=finish_reason)],
        usage=Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0),
    )


async def completion_as_chunks(completion: Completion) -> AsyncIterator[CompletionChunk]:
    """Replay a whole completion as a stream (role, content/reasoning, tool calls, finish, usage),
    for streaming callers of a synthetic final message and for tests."""
    for choice in completion.choices:
        msg, index = choice.message, choice.index
        yield {"choices": [{"index": index, "delta": {"role": "assistant"}}]}
        if msg.reasoning_text:
            yield {"choices": [{"index": index, "delta": {"reasoning": msg.reasoning_text}}]}
        if msg.content:
            yield {"choices": [{"index": index, "delta": {"content": msg.content}}]}
        for i, call in enumerate(msg.tool_calls or []):
            fn = call.function or FunctionCallDelta()
            tool_delta: ToolCallDelta = {"id": call.id, "index": i,
                                         "function": {"name": fn.name, "arguments": fn.arguments}}
            yield {"choices": [{"index": index, "delta": {"tool_calls": [tool_delta]}}]}
        yield {"choices": [{"index": index, "delta": {}, "finish_reason": choice.finish_reason or "stop"}]}
    if completion.usage is not None:
        yield {"choices": [], "usage": completion.usage}


# ------------------------------------------------------------------- the interface


class Dialect(ABC):
    """One API dialect. Stateless: one instance serves every request."""

    name: ClassVar[str]

    @abstractmethod
    def parse_request(
        self, body: bytes | Mapping[str, Any], route: RouteInfo, memo: HistoryMemo | None = None
    ) -> ParsedRequest:
        """Read a request body into the canonical upstream request; `DialectError` (400) on bad input.
        `memo` (the session's) lets a dialect skip the history items it converted for the previous call."""

    @abstractmethod
    def render_response(self, completion: Completion, request: ParsedRequest) -> dict[str, Any]:
        """vLLM's completion as this dialect's non-streaming response body."""

    @abstractmethod
    def render_stream(
        self, chunks: AsyncIterator[CompletionChunk], request: ParsedRequest
    ) -> AsyncIterator[bytes]:
        """vLLM's chunks as this dialect's SSE events, terminal event included. If `chunks` raises
        `DialectError` mid-stream, the stream ends with this dialect's in-stream error event."""

    @abstractmethod
    def error_body(self, error: DialectError) -> dict[str, Any]:
        """The JSON error body in this dialect's shape."""

    def render_error(self, error: DialectError) -> ErrorResponse:
        return ErrorResponse(status=error.status, body=self.error_body(error), headers=error_headers(error))

    def render_count_tokens(self, input_tokens: int) -> dict[str, Any]:
        """The answer to a count-tokens route; only dialects that have one override it."""
        raise DialectError(f"the {self.name} dialect has no token-counting endpoint", "not_found")

    def render_final(self, text: str, request: ParsedRequest) -> dict[str, Any] | AsyncIterator[bytes]:
        """A graceful episode-ending answer (budget exhausted, context too long) in this dialect:
        a stream if the caller asked for one, else a response body."""
        completion = final_completion(text, request.requested_model)
        if request.stream:
            return self.render_stream(completion_as_chunks(completion), request)
        return self.render_response(completion, request)


class RouteInfo(BaseModel):
    """What the URL says about a request: set by `routes.match_route`, read by `parse_request`."""

    dialect: str
    operation: Operation = Operation.GENERATE
    model: str | None = None  # Gemini puts the model in the path
    stream: bool | None = None  # Gemini picks streaming by path, not by body
    prefix: str = ""  # any path before the dialect's own (harnesses keep a base-URL path)
    query: dict[str, str] = Field(default_factory=dict)
