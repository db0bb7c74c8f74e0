"""OpenAI Chat Completions (`POST /v1/chat/completions`): Qwen Code, Mini-SWE-Agent, OpenCode.

Upstream is Chat Completions too, so this dialect is mostly validation and normalisation:
- `developer` messages become `system`; `max_completion_tokens` becomes `max_tokens`; a string
  `stop` becomes a list; `n` above 1 is refused (one rollout is one sample).
- Content may be a string or parts (Qwen Code sends tool results as parts); text and refusal
  parts are kept, image/audio/file parts get a 400 (the models trained here are text-only).
- Reasoning the caller echoes back in assistant history (`reasoning_content`/`reasoning`) is
  dropped: the chat templates of the models we train drop earlier reasoning themselves.
- Only `function` tools exist in this API; `custom` (free-text) tools get a 400.
- Unknown top-level fields are dropped, except the vLLM knobs a caller may legitimately send
  (sampling knobs, which the proxy resets, guided decoding, which a training session refuses,
  and `chat_template_kwargs`).
- Responses echo the caller's model name; reasoning comes back as `reasoning_content`; vLLM's
  token ids and logprobs stay in the proxy (they are the capture, not the caller's business).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

from harnessrl.runtime.proxy.dialects import stream as events
from harnessrl.runtime.proxy.dialects.base import (
    CONSTRAINING_EXTRAS,
    TOOL_CHOICE_MODES,
    CanonicalRequest,
    ChatMessage,
    Dialect,
    DialectError,
    FunctionCall,
    FunctionDefinition,
    FunctionTool,
    HistoryMemo,
    NamedFunction,
    NamedToolChoice,
    ParsedRequest,
    RouteInfo,
    TextPart,
    ToolCall,
    ToolChoice,
    join_text,
    new_id,
    parse_with_memo,
    unsupported_content,
)
from harnessrl.runtime.proxy.dialects.sse import sse_event
from harnessrl.runtime.proxy.dialects.upstream import Completion, CompletionChunk, Usage
from pydantic import BaseModel, ConfigDict, Field

_PASSTHROUGH_EXTRAS = (
    *CONSTRAINING_EXTRAS,
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "chat_template_kwargs",
    "reasoning_effort",
)

_FINISH_REASONS = {"stop", "length", "tool_calls", "content_filter", "function_call"}


class _In(BaseModel):
    model_config = ConfigDict(extra="allow")


class _FunctionCallIn(_In):
    name: str
    arguments: str = "{}"


class _ToolCallIn(_In):
    id: str
    type: Literal["function"] = "function"
    function: _FunctionCallIn


class _MessageIn(_In):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[_ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class _FunctionIn(_In):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _ToolIn(_In):
    type: str
    function: _FunctionIn | None = None


class _StreamOptions(_In):
    include_usage: bool | None = None


class ChatRequest(_In):
    """The Chat Completions request fields this dialect reads."""

    model: str
    messages: list[_MessageIn] = Field(min_length=1)
    tools: list[_ToolIn] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    n: int | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None


def _content(content: str | list[dict[str, Any]] | None, where: str) -> str | list[TextPart] | None:
    if content is None or isinstance(content, str):
        return content
    parts: list[TextPart] = []
    for i, part in enumerate(content):
        kind = part.get("type")
        text = part.get("text") if kind == "text" else part.get("refusal") if kind == "refusal" else None
        if kind not in ("text", "refusal"):
            raise unsupported_content(str(kind), f"{where}.content.{i}")
        if not isinstance(text, str):
            raise DialectError(f"invalid request: {where}.content.{i}: a {kind} part needs a string", param=where)
        parts.append(TextPart(text=text))
    return join_text(parts) if parts else ""


def _message(msg: _MessageIn, where: str) -> ChatMessage:
    role = "system" if msg.role == "developer" else msg.role
    if role == "tool" and not msg.tool_call_id:
        raise DialectError(f"invalid request: {where}: a tool message needs tool_call_id", param=where)
    calls = [
        ToolCall(id=c.id, function=FunctionCall(name=c.function.name, arguments=c.function.arguments))
        for c in msg.tool_calls or []
    ]
    return ChatMessage(
        role=role,
        content=_content(msg.content, where),
        tool_calls=calls or None,
        tool_call_id=msg.tool_call_id if role == "tool" else None,
        name=msg.name if role != "tool" else None,
    )


def _tools(tools: list[_ToolIn] | None) -> list[FunctionTool] | None:
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.type != "function" or tool.function is None:
            raise DialectError(f"tools.{i}: only function tools are supported, not {tool.type!r}", param=f"tools.{i}")
        fn = tool.function
        out.append(
            FunctionTool(
                function=FunctionDefinition(
                    name=fn.name, description=fn.description, parameters=fn.parameters, strict=fn.strict
                )
            )
        )
    return out


def _tool_choice(choice: str | dict[str, Any] | None) -> ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, str) and choice in TOOL_CHOICE_MODES:
        return TOOL_CHOICE_MODES[choice]
    if isinstance(choice, dict):
        if choice.get("type") == "function" and isinstance(choice.get("function"), dict):
            name = choice["function"].get("name")
            if isinstance(name, str):
                return NamedToolChoice(function=NamedFunction(name=name))
        if choice.get("type") == "allowed_tools" and isinstance(choice.get("allowed_tools"), dict):
            mode = choice["allowed_tools"].get("mode")
            if mode in ("auto", "required"):
                return TOOL_CHOICE_MODES[mode]
    raise DialectError(f"tool_choice {choice!r} is not supported", param="tool_choice")


def _usage(usage: Usage | None) -> dict[str, Any]:
    u = usage or Usage()
    out: dict[str, Any] = {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.prompt_tokens + u.output_tokens,
    }
    if u.cached_tokens:
        out["prompt_tokens_details"] = {"cached_tokens": u.cached_tokens}
    return out


def _finish(reason: str | None, has_tool_calls: bool) -> str:
    if has_tool_calls and reason in (None, "stop"):
        return "tool_calls"
    return reason if reason in _FINISH_REASONS else "stop"


_ERROR_TYPES: dict[str, tuple[str, str | None]] = {
    "invalid_request": ("invalid_request_error", None),
    "authentication": ("invalid_request_error", "invalid_api_key"),
    "permission": ("permission_error", None),
    "not_found": ("invalid_request_error", "not_found"),
    "too_large": ("invalid_request_error", "request_too_large"),
    "rate_limit": ("rate_limit_error", "rate_limit_exceeded"),
    "overloaded": ("server_error", "overloaded"),
    "timeout": ("server_error", "timeout"),
    "upstream": ("server_error", "upstream_error"),
    "internal": ("server_error", None),
}


def openai_error_body(error: DialectError) -> dict[str, Any]:
    """OpenAI's error shape, shared by Chat Completions and Responses."""
    kind, code = _ERROR_TYPES[error.kind]
    return {"error": {"message": error.message, "type": kind, "param": error.param, "code": code}}


class OpenAIChatDialect(Dialect):
    name = "openai_chat"

    def parse_request(
        self, body: bytes | Mapping[str, Any], route: RouteInfo, memo: HistoryMemo | None = None
    ) -> ParsedRequest:
        parsed = parse_with_memo(body, ChatRequest, "messages", memo, self.name)
        req = parsed.request
        if req.n not in (None, 1):
            raise DialectError("n must be 1: each rollout samples one completion", param="n")
        extras = {k: v for k, v in (req.model_extra or {}).items() if k in _PASSTHROUGH_EXTRAS}
        messages, marks = parsed.convert_items(req.messages, lambda m, where: [_message(m, where)], "messages")
        canonical = CanonicalRequest(
            model=req.model,
            messages=messages,
            tools=parsed.convert_tools(req.tools, _tools),
            tool_choice=_tool_choice(req.tool_choice),
            parallel_tool_calls=req.parallel_tool_calls,
            max_tokens=req.max_completion_tokens or req.max_tokens,
            temperature=req.temperature,
            stop=[req.stop] if isinstance(req.stop, str) else req.stop,
            seed=req.seed,
            stream=bool(req.stream),
            logit_bias=req.logit_bias,
            response_format=req.response_format,
            **extras,
        )
        parsed.remember(memo, self.name, messages, marks=marks)
        return ParsedRequest(
            canonical=canonical,
            stream=bool(req.stream),
            requested_model=req.model,
            stream_usage=bool(req.stream_options and req.stream_options.include_usage),
        )

    def render_response(self, completion: Completion, request: ParsedRequest) -> dict[str, Any]:
        choices = []
        for choice in completion.choices[:1]:
            msg = choice.message
            calls = [
                {
                    "id": c.id or new_id("call_"),
                    "type": "function",
                    "function": {"name": c.function.name or "", "arguments": c.function.arguments or "{}"},
                }
                for c in msg.tool_calls or []
                if c.function is not None
            ]
            message: dict[str, Any] = {"role": "assistant", "content": msg.content, "refusal": None}
            if calls:
                message["tool_calls"] = calls
            if msg.reasoning_text:
                message["reasoning_content"] = msg.reasoning_text
            choices.append(
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": _finish(choice.finish_reason, bool(calls)),
                }
            )
        return {
            "id": completion.id,
            "object": "chat.completion",
            "created": completion.created or int(time.time()),
            "model": request.requested_model,
            "choices": choices,
            "usage": _usage(completion.usage),
        }

    async def render_stream(
        self, chunks: AsyncIterator[CompletionChunk], request: ParsedRequest
    ) -> AsyncIterator[bytes]:
        head = {
            "id": new_id("chatcmpl-"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": request.requested_model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return sse_event({**head, "choices": [choice]})

        yield chunk({"role": "assistant", "content": ""})
        tool_index: dict[int, int] = {}  # upstream index -> our dense index
        async for event in events.stream_events(chunks):
            match event:
                case events.ReasoningDelta(text):
                    yield chunk({"reasoning_content": text})
                case events.TextDelta(text):
                    yield chunk({"content": text})
                case events.ToolCallStart(index, call_id, name):
                    tool_index[index] = len(tool_index)
                    fn = {"name": name, "arguments": ""}
                    yield chunk({"tool_calls": [{"index": tool_index[index], "id": call_id, "type": "function", "function": fn}]})
                case events.ToolArgsDelta(index, text):
                    yield chunk({"tool_calls": [{"index": tool_index[index], "function": {"arguments": text}}]})
                case events.Finished(reason, usage):
                    yield chunk({}, _finish(reason, bool(tool_index)))
                    if request.stream_usage:
                        yield sse_event({**head, "choices": [], "usage": _usage(usage)})
                    yield sse_event("[DONE]")
                case events.Failed(error):
                    yield sse_event(openai_error_body(error))

    def error_body(self, error: DialectError) -> dict[str, Any]:
        return openai_error_body(error)
