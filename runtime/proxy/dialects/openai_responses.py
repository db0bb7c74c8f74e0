"""OpenAI Responses (`POST /v1/responses`): Codex CLI, OpenCode (`@ai-sdk/openai`).

The proxy is stateless, so a request must carry its whole history (Codex does, with
`store: false`): `previous_response_id` and `item_reference` items get a 400 saying so; `store`
itself is accepted and ignored (nothing is stored).

Request -> Chat Completions:
- `instructions` becomes the first system message; `input` is a string or items. `message`
  items (roles user/assistant/system/developer; developer -> system) keep their text parts
  (`input_text`, `output_text`, `refusal`); images, files and audio get a 400 (text-only models).
  `function_call` items join the preceding assistant message as `tool_calls` (consecutive calls
  form one assistant turn, as Chat Completions templates expect); `function_call_output` items
  become `tool` messages. `reasoning` items are dropped (the trained models' templates drop old
  reasoning), as are records of provider-run tool calls (`web_search_call`, `mcp_call`, ...).
- Tools: `function` tools pass through. `namespace` tools (Codex groups MCP tools this way) are
  flattened to functions named `{namespace}__{name}`; calls to them are rendered back with
  `name` and `namespace` split again. `custom` (free-text) tools become a function with one
  string argument `input` and are rendered back as `custom_tool_call` items; their grammar is
  not enforced (it would be constrained decoding). Hosted or provider-schema tools
  (`web_search`, `file_search`, `code_interpreter`, `image_generation`, `mcp`, `computer_use*`,
  `local_shell`, `shell`, `apply_patch`, `tool_search`) are dropped: only OpenAI runs or
  describes them, and leaving them out keeps the harness working.
- `text.format` json_schema/json_object becomes `response_format` (refused in training sessions);
  `max_output_tokens` -> `max_tokens`; `reasoning` settings are not forwarded.

Response: output items `reasoning` (from vLLM's reasoning text, as `reasoning_text` content),
`message` (`output_text`), `function_call` / `custom_tool_call`; status `completed`, or
`incomplete` with `incomplete_details.reason = max_output_tokens` when the token limit hit.
The stream is the typed event sequence the SDK's ResponseStream accumulates (response.created,
response.in_progress, output_item.added/done, content_part.added/done, output_text.delta/done,
reasoning_text.delta/done, function_call_arguments.delta/done, custom_tool_call_input.delta/done,
then response.completed / response.incomplete, or response.failed), each with `sequence_number`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from harnessrl.runtime.proxy.dialects import stream as events
from harnessrl.runtime.proxy.dialects.base import (
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
    ToolOrigin,
    as_object,
    join_text,
    new_id,
    parse_with_memo,
    unsupported_content,
)
from harnessrl.runtime.proxy.dialects.openai_chat import openai_error_body
from harnessrl.runtime.proxy.dialects.sse import dumps, sse_event
from harnessrl.runtime.proxy.dialects.upstream import Completion, CompletionChunk, Usage
from pydantic import BaseModel, ConfigDict, Field

# Items that record what a provider-run tool did: nothing to send to a model that never ran them.
_PROVIDER_ITEMS = {
    "reasoning",
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "computer_call",
    "computer_call_output",
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
    "tool_search_call",
    "tool_search_output",
    "compaction",
}
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
_CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "the free-form input of this tool"}},
    "required": ["input"],
}


class _In(BaseModel):
    model_config = ConfigDict(extra="allow")


class ResponsesRequest(_In):
    """The Responses request fields this dialect reads."""

    model: str
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    stream: bool | None = False
    previous_response_id: str | None = None
    text: dict[str, Any] | None = None


def flat_name(name: str, namespace: str | None) -> str:
    if not namespace:
        return name
    return namespace + name if namespace.endswith("_") else f"{namespace}__{name}"


def _str_field(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise DialectError(f"invalid request: {where}.{key} must be a string", param=f"{where}.{key}")
    return value


def _namespace(item: Mapping[str, Any], where: str) -> str | None:
    value = item.get("namespace")
    if value is not None and not isinstance(value, str):
        raise DialectError(f"invalid request: {where}.namespace must be a string", param=f"{where}.namespace")
    return value


def _parts(content: Any, where: str) -> str | list[TextPart]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DialectError(f"invalid request: {where} must be a string or a list of parts", param=where)
    parts = []
    for i, item in enumerate(content):
        part = as_object(item, f"{where}.{i}")
        kind = part.get("type")
        if not isinstance(kind, str) or kind not in _TEXT_PARTS:
            raise unsupported_content(str(kind), f"{where}.{i}")
        parts.append(TextPart(text=_str_field(part, _TEXT_PARTS[kind], f"{where}.{i}")))
    return join_text(parts) if parts else ""


class _History:
    """Builds Chat Completions messages from Responses input items, going on from `messages` (those of earlier
    items, never changed: a session's HistoryMemo may hold them)."""

    def __init__(self, messages: list[ChatMessage]) -> None:
        self.messages = list(messages)

    def message(self, item: Mapping[str, Any], where: str) -> None:
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise DialectError(f"invalid request: {where}.role {role!r} is not a message role", param=where)
        content = _parts(item.get("content", ""), f"{where}.content")
        self.messages.append(ChatMessage(role="system" if role == "developer" else role, content=content))

    def call(self, call_id: str, name: str, arguments: str) -> None:
        """Calls join the assistant message before them (a copy of it, with the call added)."""
        call = ToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments))
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == "assistant":
            self.messages[-1] = last.model_copy(update={"tool_calls": [*(last.tool_calls or []), call]})
        else:
            self.messages.append(ChatMessage(role="assistant", tool_calls=[call]))

    def output(self, call_id: str, output: Any, where: str) -> None:
        self.messages.append(ChatMessage(role="tool", tool_call_id=call_id, content=_parts(output, where)))


def _input_messages(items: list[dict[str, Any]], first: int, known: list[ChatMessage]) -> list[ChatMessage]:
    """The canonical messages of the input items, going on from `known` (those of the items before index
    `first`, which `items` starts at)."""
    history = _History(known)
    for i, item in enumerate(items, first):
        where = f"input.{i}"
        kind = item.get("type", "message" if "role" in item else None)
        if not isinstance(kind, str):
            raise DialectError(f"invalid request: {where}.type must be a string", param=where)
        if kind == "message":
            history.message(item, where)
        elif kind == "function_call":
            name = flat_name(_str_field(item, "name", where), _namespace(item, where))
            history.call(_str_field(item, "call_id", where), name, _str_field(item, "arguments", where))
        elif kind == "custom_tool_call":
            args = dumps({"input": _str_field(item, "input", where)})
            name = flat_name(_str_field(item, "name", where), _namespace(item, where))
            history.call(_str_field(item, "call_id", where), name, args)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            history.output(_str_field(item, "call_id", where), item.get("output", ""), f"{where}.output")
        elif kind == "item_reference":
            raise DialectError(
                "item_reference is not supported: this endpoint stores nothing, send the items themselves",
                param=where,
            )
        elif kind in _PROVIDER_ITEMS:
            continue
        else:
            raise DialectError(f"invalid request: {where}: unsupported input item type {kind!r}", param=where)
    return history.messages


def _function(tool: Mapping[str, Any], name: str, where: str) -> FunctionTool:
    params = tool.get("parameters")
    description = tool.get("description")
    if params is not None and not isinstance(params, dict):
        raise DialectError(f"invalid request: {where}.parameters must be an object", param=where)
    if description is not None and not isinstance(description, str):
        raise DialectError(f"invalid request: {where}.description must be a string", param=where)
    strict = tool.get("strict")
    return FunctionTool(
        function=FunctionDefinition(
            name=name,
            description=description,
            parameters=params,
            strict=strict if isinstance(strict, bool) else None,
        )
    )


def _tools(
    tools: list[dict[str, Any]] | None,
) -> tuple[list[FunctionTool] | None, dict[str, ToolOrigin], list[str]]:
    kept: list[FunctionTool] = []
    origins: dict[str, ToolOrigin] = {}
    dropped: list[str] = []

    def add(tool: Mapping[str, Any], namespace: str | None, where: str) -> None:
        kind = tool.get("type")
        name = _str_field(tool, "name", where)
        flat = flat_name(name, namespace)
        if kind == "function":
            kept.append(_function(tool, flat, where))
            if namespace:
                origins[flat] = ToolOrigin(name=name, namespace=namespace)
        elif kind == "custom":
            description = tool.get("description")
            custom = {"description": description, "parameters": _CUSTOM_PARAMETERS}
            kept.append(_function(custom, flat, where))
            origins[flat] = ToolOrigin(name=name, namespace=namespace, kind="custom")
        else:
            dropped.append(f"{kind}:{name}")

    for i, tool in enumerate(tools or []):
        where = f"tools.{i}"
        kind = tool.get("type")
        if kind == "namespace":
            namespace = _str_field(tool, "name", where)
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise DialectError(f"invalid request: {where}.tools must be a list", param=where)
            for j, sub in enumerate(inner):
                add(as_object(sub, f"{where}.tools.{j}"), namespace, f"{where}.tools.{j}")
        elif kind in ("function", "custom"):
            add(tool, None, where)
        else:
            dropped.append(str(kind) + (f":{tool['name']}" if isinstance(tool.get("name"), str) else ""))
    return (kept or None) if tools is not None else None, origins, dropped


def _tool_choice(choice: str | dict[str, Any] | None) -> ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, str) and choice in TOOL_CHOICE_MODES:
        return TOOL_CHOICE_MODES[choice]
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind in ("function", "custom") and isinstance(choice.get("name"), str):
            name = flat_name(choice["name"], _namespace(choice, "tool_choice"))
            return NamedToolChoice(function=NamedFunction(name=name))
        if kind == "allowed_tools" and choice.get("mode") in ("auto", "required"):
            return TOOL_CHOICE_MODES[choice["mode"]]
        if isinstance(kind, str):  # a hosted tool (web_search, mcp, ...) that is not offered upstream
            return "auto"
    raise DialectError(f"tool_choice {choice!r} is not supported", param="tool_choice")


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": fmt.get("type")}


def _usage(usage: Usage | None, prompt_tokens: int | None = None) -> dict[str, Any]:
    u = usage or Usage()
    prompt = u.prompt_tokens or prompt_tokens or 0
    reasoning = int((u.completion_tokens_details or {}).get("reasoning_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + u.output_tokens,
    }


class _Items:
    """Output items of one response, built the same way for a whole completion or a stream."""

    def __init__(self, request: ParsedRequest) -> None:
        self.request = request
        self.items: list[dict[str, Any]] = []

    def _add(self, item: dict[str, Any]) -> dict[str, Any]:
        self.items.append(item)
        return item

    def reasoning(self, item_id: str, text: str) -> dict[str, Any]:
        content = [{"type": "reasoning_text", "text": text}]
        return self._add({"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": "completed"})

    def message(self, item_id: str, text: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return self._add(
            {"type": "message", "id": item_id, "status": "completed", "role": "assistant", "content": [part]}
        )

    def call(self, item_id: str, call_id: str, name: str, arguments: str) -> dict[str, Any]:
        return self._add({**call_item(self.request, item_id, call_id, name, arguments), "status": "completed"})


def is_custom(request: ParsedRequest, name: str) -> bool:
    origin = request.tool_origins.get(name)
    return origin is not None and origin.kind == "custom"


def call_item(request: ParsedRequest, item_id: str, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """A function_call (or custom_tool_call) item for a canonical call, names split back."""
    origin = request.tool_origins.get(name)
    item: dict[str, Any] = {"id": item_id, "call_id": call_id, "name": origin.name if origin else name}
    if is_custom(request, name):
        raw = events.parse_arguments(arguments).get("input", "") if arguments else ""
        item.update(type="custom_tool_call", input=raw if isinstance(raw, str) else dumps(raw))
    else:
        item.update(type="function_call", arguments=arguments)
    if origin is not None and origin.namespace:
        item["namespace"] = origin.namespace
    return item


class OpenAIResponsesDialect(Dialect):
    name = "openai_responses"

    def parse_request(
        self, body: bytes | Mapping[str, Any], route: RouteInfo, memo: HistoryMemo | None = None
    ) -> ParsedRequest:
        parsed = parse_with_memo(body, ResponsesRequest, "input", memo, self.name)
        req = parsed.request
        if req.previous_response_id:
            raise DialectError(
                "previous_response_id is not supported: this endpoint stores no responses; "
                "send the whole conversation in `input` (store: false)",
                param="previous_response_id",
            )
        tools, origins, dropped = parsed.convert_tools(req.tools, _tools)
        choice = _tool_choice(req.tool_choice)  # validated even when no tool is left to choose
        if isinstance(req.input, str):
            converted = [ChatMessage(role="user", content=req.input)]
        else:
            converted = _input_messages(req.input, parsed.seen, parsed.known)
        system = [ChatMessage(role="system", content=req.instructions)] if req.instructions else []
        canonical = CanonicalRequest(
            model=req.model,
            messages=system + converted,
            tools=tools,
            tool_choice=choice if tools else None,
            parallel_tool_calls=req.parallel_tool_calls if tools else None,
            max_tokens=req.max_output_tokens,
            temperature=req.temperature,
            stream=bool(req.stream),
            response_format=_response_format(req.text),
        )
        if not canonical.messages:
            raise DialectError("invalid request: input is empty", param="input")
        parsed.remember(memo, self.name, converted)
        return ParsedRequest(
            canonical=canonical,
            stream=bool(req.stream),
            requested_model=req.model,
            tool_origins=origins,
            dropped_tools=dropped,
        )

    def _response(
        self, rid: str, request: ParsedRequest, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        return {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "model": request.requested_model,
            "output": output,
            "parallel_tool_calls": request.canonical.parallel_tool_calls is not False,
            "tool_choice": "auto",
            "tools": [],
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": None,
            "metadata": {},
            "temperature": request.canonical.temperature,
            "top_p": None,
            "max_output_tokens": request.canonical.max_tokens,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "usage": usage,
        }

    def render_response(self, completion: Completion, request: ParsedRequest) -> dict[str, Any]:
        items = _Items(request)
        status = "completed"
        for choice in completion.choices[:1]:
            msg = choice.message
            if msg.reasoning_text:
                items.reasoning(new_id("rs_"), msg.reasoning_text)
            if msg.content:
                items.message(new_id("msg_"), msg.content)
            for call in msg.tool_calls or []:
                if call.function is not None and call.function.name:
                    call_id = call.id or new_id("call_")
                    prefix = "ctc_" if is_custom(request, call.function.name) else "fc_"
                    items.call(new_id(prefix), call_id, call.function.name, call.function.arguments or "{}")
            if choice.finish_reason == "length":
                status = "incomplete"
        return self._response(new_id("resp_"), request, status, items.items, _usage(completion.usage))

    async def render_stream(
        self, chunks: AsyncIterator[CompletionChunk], request: ParsedRequest
    ) -> AsyncIterator[bytes]:
        rid = new_id("resp_")
        seq = -1
        items = _Items(request)
        prompt_tokens: int | None = None
        # The open output item: its kind ("reasoning" | "message" | "call"), id, and text so far
        # (reasoning or message text, or the call's argument text); for a call, its call id and name.
        kind: str | None = None
        item_id, text, call_id, call_name = "", "", "", ""

        def ev(data: dict[str, Any]) -> bytes:
            nonlocal seq
            seq += 1
            return sse_event({**data, "sequence_number": seq}, data["type"])

        def close() -> list[bytes]:
            """Finish the open item: its .done events, then output_item.done."""
            nonlocal kind
            at = len(items.items)
            base = {"item_id": item_id, "output_index": at}
            out: list[bytes] = []
            if kind == "reasoning":
                item = items.reasoning(item_id, text)
                out.append(ev({"type": "response.reasoning_text.done", **base, "content_index": 0, "text": text}))
            elif kind == "message":
                item = items.message(item_id, text)
                done = {**base, "content_index": 0}
                out.append(ev({"type": "response.output_text.done", **done, "text": text, "logprobs": []}))
                out.append(ev({"type": "response.content_part.done", **done, "part": item["content"][0]}))
            elif kind == "call":
                item = items.call(item_id, call_id, call_name, text)
                if item["type"] == "custom_tool_call":
                    # The model writes {"input": ...} as JSON; the raw input is known only at the end.
                    out.append(ev({"type": "response.custom_tool_call_input.delta", **base, "delta": item["input"]}))
                    out.append(ev({"type": "response.custom_tool_call_input.done", **base, "input": item["input"]}))
                else:
                    done_args = {"arguments": text, "name": item["name"]}
                    out.append(ev({"type": "response.function_call_arguments.done", **base, **done_args}))
            else:
                return out
            out.append(ev({"type": "response.output_item.done", "output_index": at, "item": item}))
            kind = None
            return out

        def open_item(new_kind: str, added: dict[str, Any]) -> list[bytes]:
            nonlocal kind, item_id, text
            out = close()
            kind, item_id, text = new_kind, added["id"], ""
            out.append(ev({"type": "response.output_item.added", "output_index": len(items.items), "item": added}))
            return out

        async for event in events.stream_events(chunks):
            match event:
                case events.Started(prompt):
                    prompt_tokens = prompt
                    shell = self._response(rid, request, "in_progress", [], None)
                    yield ev({"type": "response.created", "response": shell})
                    yield ev({"type": "response.in_progress", "response": shell})
                case events.ReasoningDelta(delta):
                    if kind != "reasoning":
                        added = {"type": "reasoning", "id": new_id("rs_"), "summary": [], "content": [], "status": "in_progress"}
                        for b in open_item("reasoning", added):
                            yield b
                    text += delta
                    at = {"item_id": item_id, "output_index": len(items.items), "content_index": 0}
                    yield ev({"type": "response.reasoning_text.delta", **at, "delta": delta})
                case events.TextDelta(delta):
                    opening = kind != "message"
                    if opening:
                        added = {"type": "message", "id": new_id("msg_"), "status": "in_progress", "role": "assistant", "content": []}
                        for b in open_item("message", added):
                            yield b
                    at = {"item_id": item_id, "output_index": len(items.items), "content_index": 0}
                    if opening:
                        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                        yield ev({"type": "response.content_part.added", **at, "part": part})
                    text += delta
                    yield ev({"type": "response.output_text.delta", **at, "delta": delta, "logprobs": []})
                case events.ToolCallStart(_, new_call_id, name):
                    prefix = "ctc_" if is_custom(request, name) else "fc_"
                    added = {**call_item(request, new_id(prefix), new_call_id, name, ""), "status": "in_progress"}
                    for b in open_item("call", added):
                        yield b
                    call_id, call_name = new_call_id, name
                case events.ToolArgsDelta(_, delta):
                    text += delta
                    if not is_custom(request, call_name):
                        at = {"item_id": item_id, "output_index": len(items.items)}
                        yield ev({"type": "response.function_call_arguments.delta", **at, "delta": delta})
                case events.Finished(reason, usage):
                    for b in close():
                        yield b
                    status = "incomplete" if reason == "length" else "completed"
                    done = self._response(rid, request, status, items.items, _usage(usage, prompt_tokens))
                    yield ev({"type": f"response.{status}", "response": done})
                case events.Failed(error):
                    if seq < 0:
                        shell = self._response(rid, request, "in_progress", [], None)
                        yield ev({"type": "response.created", "response": shell})
                    failed = self._response(rid, request, "failed", items.items, None)
                    failed["error"] = {"code": _failure_code(error), "message": error.message}
                    yield ev({"type": "response.failed", "response": failed})

    def error_body(self, error: DialectError) -> dict[str, Any]:
        return openai_error_body(error)


def _failure_code(error: DialectError) -> str:
    if error.kind == "rate_limit":
        return "rate_limit_exceeded"
    return "invalid_prompt" if error.kind == "invalid_request" else "server_error"
