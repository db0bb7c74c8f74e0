"""Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`): Claude Code, OpenCode.

Request -> Chat Completions:
- `system` (string or text blocks) becomes one system message. Claude Code sends a first block
  `x-anthropic-billing-header: cc_version=...; cch=<hash>`; Anthropic lifts it out for billing
  (the model never sees it) and it changes between calls, so its line is removed (keeping it
  would also break the prefix linking of turns); a block left empty is dropped.
- User `tool_result` blocks become `tool` messages (text or text blocks; `is_error` is kept
  as-is, the text says what failed), placed before the rest of that user turn's text. Assistant
  `tool_use` blocks become `tool_calls` (input serialised as JSON). `thinking` and
  `redacted_thinking` history is dropped (the trained models' templates drop old reasoning);
  `server_tool_use` / `*_tool_result` history of provider-run tools is dropped too.
- Image and document blocks get a 400: the models trained here are text-only.
- Custom tools (`input_schema`) become function tools. Tools with a `type` other than
  `custom` (server tools such as `web_search_20250305`, `web_fetch_*`, `code_execution_*`, and
  Anthropic-schema client tools such as `bash_*`/`text_editor_*`) are dropped from the upstream
  request: only Anthropic can run or describe them, and leaving them out keeps the harness
  working (the model simply does not see them). Dropped names are reported in `dropped_tools`.
- Structured outputs (`output_config.format`, `output_format`) become `response_format`.
- `tool_choice`: auto -> auto, any -> required, tool -> that function, none -> none;
  `disable_parallel_tool_use` -> `parallel_tool_calls: false`. `top_p`/`top_k` are left out
  (the proxy samples from the full distribution); `thinking` settings are not forwarded (the
  served model's template decides).

Response: content blocks thinking (from vLLM's reasoning) / text / tool_use, stop_reason
end_turn | tool_use | max_tokens | stop_sequence, usage input_tokens / output_tokens. The
stream is message_start, ping, content_block_start/delta/stop per block, message_delta (stop
reason, usage), message_stop. Tool input is sent as one `input_json_delta` when its block
closes, as valid JSON: the SDK parses every delta and would fail on a model's broken JSON.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

from harnessrl.runtime.proxy.dialects import stream as events
from harnessrl.runtime.proxy.dialects.base import (
    TOOL_CHOICE_MODES,
    CanonicalRequest,
    ChatMessage,
    Dialect,
    DialectError,
    ErrorResponse,
    FunctionCall,
    FunctionDefinition,
    FunctionTool,
    HistoryMemo,
    NamedFunction,
    NamedToolChoice,
    Operation,
    ParsedRequest,
    RouteInfo,
    TextPart,
    ToolCall,
    ToolChoice,
    as_object,
    error_headers,
    join_text,
    new_id,
    parse_with_memo,
    unsupported_content,
)
from harnessrl.runtime.proxy.dialects.sse import dumps, sse_event
from harnessrl.runtime.proxy.dialects.upstream import Completion, CompletionChunk, Usage
from pydantic import BaseModel, ConfigDict, Field

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"

# History blocks of tools that only Anthropic runs: dropped, not refused.
_PROVIDER_BLOCKS = ("server_tool_use", "redacted_thinking", "thinking")


class _In(BaseModel):
    model_config = ConfigDict(extra="allow")


class _MessageIn(_In):
    # "system" is not in Anthropic's public schema, but Claude Code 2.1 sends reminders that way mid-conversation.
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class _ToolIn(_In):
    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class _ToolChoiceIn(_In):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MessagesRequest(_In):
    """The Messages request fields this dialect reads (count_tokens omits `max_tokens`)."""

    model: str
    messages: list[_MessageIn]
    max_tokens: int | None = Field(default=None, ge=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[_ToolIn] | None = None
    tool_choice: _ToolChoiceIn | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    stream: bool | None = False
    output_config: dict[str, Any] | None = None
    output_format: dict[str, Any] | None = None  # the structured-outputs beta's older spelling


def _text_of(block: Mapping[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise DialectError(f"invalid request: {where}: a text block needs a string `text`", param=where)
    return text


def _text_blocks(blocks: list[Any], where: str) -> list[TextPart]:
    parts = []
    for i, item in enumerate(blocks):
        block = as_object(item, f"{where}.{i}")
        kind = block.get("type")
        if kind != "text":
            raise unsupported_content(str(kind), f"{where}.{i}")
        parts.append(TextPart(text=_text_of(block, f"{where}.{i}")))
    return parts


_BILLING_LINE = re.compile(rf"^{re.escape(BILLING_HEADER_PREFIX)}.*(?:\n|$)", re.MULTILINE)


def _system(system: str | list[dict[str, Any]] | None) -> ChatMessage | None:
    if system is None:
        return None
    texts = [system] if isinstance(system, str) else [p.text for p in _text_blocks(system, "system")]
    parts = [TextPart(text=t) for t in (_BILLING_LINE.sub("", t) for t in texts) if t]
    return ChatMessage(role="system", content=join_text(parts)) if parts else None


def _tool_result(block: dict[str, Any], where: str) -> ChatMessage:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise DialectError(f"invalid request: {where}: tool_result needs a string tool_use_id", param=where)
    content = block.get("content", "")
    if isinstance(content, str):
        text: str | list[TextPart] = content
    elif isinstance(content, list):
        parts = _text_blocks(content, f"{where}.content")
        text = join_text(parts) if parts else ""
    else:
        raise DialectError(f"invalid request: {where}.content must be a string or blocks", param=where)
    return ChatMessage(role="tool", tool_call_id=call_id, content=text)


def _user(content: list[dict[str, Any]], where: str) -> list[ChatMessage]:
    tool_messages: list[ChatMessage] = []
    parts: list[TextPart] = []
    for i, block in enumerate(content):
        kind = block.get("type")
        at = f"{where}.content.{i}"
        if kind == "text":
            parts.append(TextPart(text=_text_of(block, at)))
        elif kind == "tool_result":
            tool_messages.append(_tool_result(block, at))
        elif isinstance(kind, str) and (kind in _PROVIDER_BLOCKS or kind.endswith("_tool_result")):
            continue
        else:
            raise unsupported_content(str(kind), at)
    if parts:
        tool_messages.append(ChatMessage(role="user", content=join_text(parts)))
    return tool_messages


def _assistant(content: list[dict[str, Any]], where: str) -> ChatMessage:
    parts: list[TextPart] = []
    calls: list[ToolCall] = []
    for i, block in enumerate(content):
        kind = block.get("type")
        at = f"{where}.content.{i}"
        if kind == "text":
            parts.append(TextPart(text=_text_of(block, at)))
        elif kind == "tool_use":
            call_id, name, args = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(args, dict):
                raise DialectError(f"invalid request: {at}: tool_use needs id, name and an object input", param=at)
            calls.append(ToolCall(id=call_id, function=FunctionCall(name=name, arguments=dumps(args))))
        elif isinstance(kind, str) and (kind in _PROVIDER_BLOCKS or kind.endswith("_tool_result")):
            continue
        else:
            raise unsupported_content(str(kind), at)
    # Text or tool calls; an assistant turn of only (dropped) thinking becomes empty text, never
    # a null content that a chat template might print.
    text = join_text(parts) if parts else (None if calls else "")
    return ChatMessage(role="assistant", content=text, tool_calls=calls or None)


def _item(msg: _MessageIn, where: str) -> list[ChatMessage]:
    """The canonical messages of one history item: each converts on its own (what `HistoryMemo` relies on)."""
    if msg.role == "system":
        return [m for m in [_system(msg.content)] if m is not None]
    if isinstance(msg.content, str):
        return [ChatMessage(role=msg.role, content=msg.content)]
    if msg.role == "user":
        return _user(msg.content, where)
    return [_assistant(msg.content, where)]


def _tools(tools: list[_ToolIn] | None) -> tuple[list[FunctionTool] | None, list[str]]:
    if tools is None:
        return None, []
    kept, dropped = [], []
    for tool in tools:
        if tool.type not in (None, "custom"):
            dropped.append(f"{tool.type}:{tool.name}")
            continue
        definition = FunctionDefinition(
            name=tool.name, description=tool.description, parameters=tool.input_schema or {"type": "object"}
        )
        kept.append(FunctionTool(function=definition))
    return kept or None, dropped


def _tool_choice(choice: _ToolChoiceIn | None) -> ToolChoice | None:
    if choice is None:
        return None
    if choice.type == "tool":
        if not choice.name:
            raise DialectError("tool_choice of type 'tool' needs a name", param="tool_choice.name")
        return NamedToolChoice(function=NamedFunction(name=choice.name))
    return TOOL_CHOICE_MODES["required" if choice.type == "any" else choice.type]


def _response_format(req: MessagesRequest) -> dict[str, Any] | None:
    """Structured outputs (`output_config.format` / `output_format`) as Chat Completions'
    `response_format`, so the canonical check refuses them in training sessions."""
    fmt = (req.output_config or {}).get("format") or req.output_format
    if not isinstance(fmt, dict):
        return None
    schema = fmt.get("schema") if isinstance(fmt.get("schema"), dict) else {}
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def _stop_reason(reason: str | None, has_tool_calls: bool, stop_sequence: str | None) -> str:
    if has_tool_calls or reason == "tool_calls":
        return "tool_use"
    if reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def _matched_stop(stop_reason: int | str | None, request: ParsedRequest) -> str | None:
    """vLLM's `stop_reason` is the stop string it matched (or a stop token id, which is no stop
    sequence of the caller's)."""
    stops = request.canonical.stop or []
    return stop_reason if isinstance(stop_reason, str) and stop_reason in stops else None


def _usage(usage: Usage | None, prompt_tokens: int | None = None) -> dict[str, Any]:
    u = usage or Usage()
    return {
        "input_tokens": (u.prompt_tokens or prompt_tokens or 0) - u.cached_tokens,
        "output_tokens": u.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
    }


_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "too_large": "request_too_large",
    "rate_limit": "rate_limit_error",
    "overloaded": "overloaded_error",
    "timeout": "timeout_error",
    "upstream": "api_error",
    "internal": "api_error",
}


class AnthropicDialect(Dialect):
    name = "anthropic"

    def parse_request(
        self, body: bytes | Mapping[str, Any], route: RouteInfo, memo: HistoryMemo | None = None
    ) -> ParsedRequest:
        parsed = parse_with_memo(body, MessagesRequest, "messages", memo, self.name)
        req = parsed.request
        counting = route.operation is Operation.COUNT_TOKENS
        if req.max_tokens is None and not counting:
            raise DialectError("invalid request: max_tokens: Field required", param="max_tokens")
        tools, dropped = parsed.convert_tools(req.tools, _tools)
        parallel = None
        if req.tool_choice is not None and req.tool_choice.disable_parallel_tool_use:
            parallel = False
        choice = _tool_choice(req.tool_choice)  # validated even when no tool is left to choose
        converted, marks = parsed.convert_items(req.messages, _item, "messages")
        canonical = CanonicalRequest(
            model=req.model,
            messages=[m for m in [_system(req.system)] if m is not None] + converted,
            tools=tools,
            tool_choice=choice if tools else None,
            parallel_tool_calls=parallel if tools else None,
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            stop=req.stop_sequences or None,
            stream=bool(req.stream) and not counting,
            response_format=_response_format(req),
        )
        parsed.remember(memo, self.name, converted, marks=marks)
        return ParsedRequest(
            canonical=canonical,
            operation=route.operation,
            stream=canonical.stream,
            requested_model=req.model,
            dropped_tools=dropped,
        )

    def render_response(self, completion: Completion, request: ParsedRequest) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        reason, stop_reason, calls = "stop", None, 0
        for choice in completion.choices[:1]:
            msg = choice.message
            reason, stop_reason = choice.finish_reason or "stop", choice.stop_reason
            if msg.reasoning_text:
                content.append({"type": "thinking", "thinking": msg.reasoning_text, "signature": ""})
            if msg.content:
                content.append({"type": "text", "text": msg.content})
            for call in msg.tool_calls or []:
                fn = call.function
                if fn is None or not fn.name:
                    continue
                content.append(
                    {"type": "tool_use", "id": call.id or new_id("toolu_"), "name": fn.name, "input": events.parse_arguments(fn.arguments)}
                )
                calls += 1
        matched = _matched_stop(stop_reason, request)
        return {
            "id": new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": request.requested_model,
            "content": content,
            "stop_reason": _stop_reason(reason, calls > 0, matched),
            "stop_sequence": matched,
            "usage": _usage(completion.usage),
        }

    async def render_stream(
        self, chunks: AsyncIterator[CompletionChunk], request: ParsedRequest
    ) -> AsyncIterator[bytes]:
        def ev(data: dict[str, Any]) -> bytes:
            return sse_event(data, data["type"])

        index = -1  # index of the open content block
        open_kind: str | None = None  # "thinking" | "text" | "tool_use"
        tool_args: dict[int, str] = {}  # upstream tool index -> argument text so far
        open_tool: int | None = None
        has_tools = False
        prompt_tokens: int | None = None

        def close() -> list[bytes]:
            nonlocal open_kind, open_tool
            out = []
            if open_kind == "tool_use" and open_tool is not None:
                partial = dumps(events.parse_arguments(tool_args.get(open_tool)))
                delta = {"type": "input_json_delta", "partial_json": partial}
                out.append(ev({"type": "content_block_delta", "index": index, "delta": delta}))
            if open_kind is not None:
                out.append(ev({"type": "content_block_stop", "index": index}))
            open_kind, open_tool = None, None
            return out

        def open_block(block: dict[str, Any]) -> list[bytes]:
            nonlocal index, open_kind
            out = close()
            index += 1
            open_kind = block["type"]
            out.append(ev({"type": "content_block_start", "index": index, "content_block": block}))
            return out

        async for event in events.stream_events(chunks):
            match event:
                case events.Started(prompt):
                    prompt_tokens = prompt
                    message: dict[str, Any] = {
                        "id": new_id("msg_"),
                        "type": "message",
                        "role": "assistant",
                        "model": request.requested_model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {"input_tokens": prompt or 0, "output_tokens": 0},
                    }
                    yield ev({"type": "message_start", "message": message})
                    yield ev({"type": "ping"})
                case events.ReasoningDelta(text):
                    if open_kind != "thinking":
                        for b in open_block({"type": "thinking", "thinking": "", "signature": ""}):
                            yield b
                    delta = {"type": "thinking_delta", "thinking": text}
                    yield ev({"type": "content_block_delta", "index": index, "delta": delta})
                case events.TextDelta(text):
                    if open_kind != "text":
                        for b in open_block({"type": "text", "text": ""}):
                            yield b
                    yield ev({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}})
                case events.ToolCallStart(upstream_index, call_id, name):
                    for b in open_block({"type": "tool_use", "id": call_id, "name": name, "input": {}}):
                        yield b
                    open_tool, has_tools = upstream_index, True
                case events.ToolArgsDelta(upstream_index, text):
                    tool_args[upstream_index] = tool_args.get(upstream_index, "") + text
                case events.Finished(reason, usage, stop):
                    for b in close():
                        yield b
                    matched = stop if stop in (request.canonical.stop or []) else None
                    end: dict[str, Any] = {"stop_reason": _stop_reason(reason, has_tools, matched), "stop_sequence": matched}
                    yield ev({"type": "message_delta", "delta": end, "usage": _usage(usage, prompt_tokens)})
                    yield ev({"type": "message_stop"})
                case events.Failed(error):
                    yield ev(self.error_body(error))

    def error_body(self, error: DialectError) -> dict[str, Any]:
        return {"type": "error", "error": {"type": _ERROR_TYPES[error.kind], "message": error.message}}

    def render_error(self, error: DialectError) -> ErrorResponse:
        # Anthropic answers "overloaded" with 529, which Claude Code retries with backoff.
        status = 529 if error.kind == "overloaded" else error.status
        return ErrorResponse(status=status, body=self.error_body(error), headers=error_headers(error))

    def render_count_tokens(self, input_tokens: int) -> dict[str, Any]:
        return {"input_tokens": input_tokens}


