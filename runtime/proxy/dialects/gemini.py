"""Gemini (`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent`,
`:countTokens`): Gemini CLI, OpenCode (`@ai-sdk/google`), Mini-SWE-Agent's Gemini mode.

Bodies are accepted in camelCase (the REST API, Gemini CLI) and snake_case (Python callers):
every request model takes both spellings of each field; free-form values (tool arguments,
function responses, JSON schemas) are left as sent. The model comes from the path.

Request -> Chat Completions:
- `systemInstruction` (Content, or a plain string) becomes the system message.
- `contents`: role `user` text parts -> user messages; `functionResponse` parts -> `tool`
  messages (a response of the form `{"output": "text"}`, as Gemini CLI sends, becomes that text;
  any other response is sent as JSON). Role `model` text -> assistant content, `functionCall` ->
  `tool_calls`; `thought` parts are dropped (the trained models' templates drop old reasoning).
  Calls and responses are paired by `id` when the caller sends one, else by name in order, as
  the Gemini API does. Inline data / file parts get a 400 (text-only models); executable code
  and code-execution results (from the provider-run code tool) are dropped.
- `tools[].functionDeclarations` become function tools (`parametersJsonSchema`, or
  `parameters` with Gemini's upper-case OpenAPI type names lowered to JSON Schema's). Tools
  only Google runs (`googleSearch`, `codeExecution`, `urlContext`, ...) are dropped.
- `toolConfig.functionCallingConfig.mode`: AUTO/VALIDATED -> auto, NONE -> none, ANY -> required
  (or the one function when `allowedFunctionNames` names exactly one).
- `generationConfig`: temperature, maxOutputTokens, stopSequences, seed; candidateCount above 1
  is refused; `responseMimeType: application/json` / `responseSchema` / `responseJsonSchema`
  become `response_format` (refused in training sessions); topP/topK/penalties are left out
  (the proxy samples from the full distribution); thinkingConfig is not forwarded.

Response: one candidate, parts `{text, thought: true}` (vLLM's reasoning), `{text}`,
`{functionCall: {name, args, id}}`; finishReason STOP / MAX_TOKENS; usageMetadata
promptTokenCount / candidatesTokenCount / totalTokenCount. `streamGenerateContent` always
answers SSE (`data: GenerateContentResponse` per chunk; the SDK and Gemini CLI ask `alt=sse`);
function calls are sent whole, in the chunk after their arguments are complete.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from harnessrl.runtime.proxy.dialects import stream as events
from harnessrl.runtime.proxy.dialects.base import (
    CanonicalRequest,
    ChatMessage,
    Dialect,
    DialectError,
    FunctionCall,
    FunctionDefinition,
    FunctionTool,
    HistoryMemo,
    MemoParsed,
    NamedFunction,
    NamedToolChoice,
    Operation,
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
from harnessrl.runtime.proxy.dialects.sse import dumps, sse_event
from harnessrl.runtime.proxy.dialects.upstream import Completion, CompletionChunk, Usage
from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class _G(BaseModel):
    """Gemini request models: camelCase or snake_case field names, unknown fields kept."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)


class _FunctionCall(_G):
    name: str
    args: dict[str, Any] | None = None
    id: str | None = None


class _FunctionResponse(_G):
    name: str
    response: dict[str, Any] | None = None
    id: str | None = None


class _Part(_G):
    text: str | None = None
    thought: bool | None = None
    function_call: _FunctionCall | None = None
    function_response: _FunctionResponse | None = None
    inline_data: dict[str, Any] | None = None
    file_data: dict[str, Any] | None = None


class _Content(_G):
    role: str | None = None
    parts: list[_Part] = Field(default_factory=list)


class _Declaration(_G):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    parameters_json_schema: dict[str, Any] | None = None


class _Tool(_G):
    function_declarations: list[_Declaration] | None = None


class _CallingConfig(_G):
    mode: str | None = None
    allowed_function_names: list[str] | None = None


class _ToolConfig(_G):
    function_calling_config: _CallingConfig | None = None


class _GenerationConfig(_G):
    temperature: float | None = Field(default=None, ge=0)
    max_output_tokens: int | None = Field(default=None, ge=1)
    stop_sequences: list[str] | None = None
    candidate_count: int | None = None
    seed: int | None = None
    response_mime_type: str | None = None
    response_schema: dict[str, Any] | None = None
    response_json_schema: dict[str, Any] | None = Field(
        default=None, validation_alias=AliasChoices("responseJsonSchema", "response_json_schema", "_responseJsonSchema")
    )


class GenerateContentRequest(_G):
    """The generateContent request fields this dialect reads."""

    contents: list[_Content] = Field(default_factory=list)
    system_instruction: _Content | str | None = None
    tools: list[_Tool] | None = None
    tool_config: _ToolConfig | None = None
    generation_config: _GenerationConfig | None = None


class _CountTokensRequest(_G):
    contents: list[_Content] | None = None
    generate_content_request: GenerateContentRequest | None = None


_OPENAPI_TYPES = {"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"}


def _json_schema(schema: Any) -> Any:
    """Gemini's OpenAPI-style Schema (`type: "OBJECT"`) as JSON Schema (`type: "object"`)."""
    if isinstance(schema, list):
        return [_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str) and value in _OPENAPI_TYPES:
            out[key] = value.lower()
        elif key in ("properties", "definitions", "$defs") and isinstance(value, dict):
            out[key] = {k: _json_schema(v) for k, v in value.items()}
        else:
            out[key] = _json_schema(value)
    return out


def _text_parts(content: _Content) -> list[TextPart]:
    return [TextPart(text=p.text) for p in content.parts if p.text is not None and not p.thought]


class _Pairing:
    """Tool-call ids for calls and responses that may not carry one. A response with an id takes
    that call; one without takes the first open call of its name that had no id either (else
    any open call of its name), as the Gemini API pairs them."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, str, bool]] = []  # (name, id, id came from the caller)
        self.count = 0

    def copy(self) -> _Pairing:
        twin = _Pairing()
        twin.pending, twin.count = list(self.pending), self.count
        return twin

    def call_id(self, call: _FunctionCall) -> str:
        self.count += 1
        call_id = call.id or f"call_{self.count}"
        self.pending.append((call.name, call_id, call.id is not None))
        return call_id

    def response_id(self, response: _FunctionResponse) -> str:
        if response.id is not None:
            matches = [i for i, (_, cid, _) in enumerate(self.pending) if cid == response.id]
        else:
            by_name = [i for i, (name, _, _) in enumerate(self.pending) if name == response.name]
            matches = [i for i in by_name if not self.pending[i][2]] + by_name
        if not matches:
            return response.id or f"call_unmatched_{response.name}"
        return self.pending.pop(matches[0])[1]


def _tool_output(response: dict[str, Any] | None) -> str:
    if response is not None and set(response) == {"output"} and isinstance(response["output"], str):
        return response["output"]
    return dumps(response or {})


def _check_parts(content: _Content, where: str) -> None:
    for i, part in enumerate(content.parts):
        if part.inline_data is not None or part.file_data is not None:
            kind = "inlineData" if part.inline_data is not None else "fileData"
            raise unsupported_content(kind, f"{where}.parts.{i}")


def _system_message(system: _Content | str | None) -> ChatMessage | None:
    if isinstance(system, str) and system:
        return ChatMessage(role="system", content=system)
    if isinstance(system, _Content):
        _check_parts(system, "systemInstruction")
        parts = _text_parts(system)
        if parts:
            return ChatMessage(role="system", content=join_text(parts))
    return None


def _history(contents: list[_Content], first: int, pairing: _Pairing) -> list[ChatMessage]:
    """The canonical messages of `contents`, which start at index `first` of the request's list; `pairing`
    holds the calls still open before them and is updated."""
    out: list[ChatMessage] = []
    for i, content in enumerate(contents, first):
        where = f"contents.{i}"
        _check_parts(content, where)
        role = content.role or "user"
        parts = _text_parts(content)
        if role == "model":
            calls = [
                ToolCall(id=pairing.call_id(p.function_call), function=FunctionCall(name=p.function_call.name, arguments=dumps(p.function_call.args or {})))
                for p in content.parts
                if p.function_call is not None
            ]
            if parts or calls:
                out.append(ChatMessage(role="assistant", content=join_text(parts) if parts else None, tool_calls=calls or None))
        elif role in ("user", "function", "tool"):
            for p in content.parts:
                if p.function_response is not None:
                    call_id = pairing.response_id(p.function_response)
                    out.append(ChatMessage(role="tool", tool_call_id=call_id, content=_tool_output(p.function_response.response)))
            if parts:
                out.append(ChatMessage(role="user", content=join_text(parts)))
        else:
            raise DialectError(f"invalid request: {where}.role must be 'user' or 'model', not {role!r}", param=where)
    return out


def _tools(tools: list[_Tool] | None) -> tuple[list[FunctionTool] | None, list[str]]:
    if tools is None:
        return None, []
    kept, dropped = [], []
    for tool in tools:
        for decl in tool.function_declarations or []:
            params = decl.parameters_json_schema or _json_schema(decl.parameters) or {"type": "object", "properties": {}}
            kept.append(FunctionTool(function=FunctionDefinition(name=decl.name, description=decl.description, parameters=params)))
        dropped += sorted(tool.model_extra or {})
    return kept or None, dropped


def _tool_choice(config: _ToolConfig | None) -> ToolChoice | None:
    calling = config.function_calling_config if config else None
    mode = (calling.mode or "AUTO").upper() if calling else None
    if calling is None or mode in ("AUTO", "VALIDATED", "MODE_UNSPECIFIED"):
        return None if calling is None else "auto"
    if mode == "NONE":
        return "none"
    if mode == "ANY":
        names = calling.allowed_function_names or []
        return NamedToolChoice(function=NamedFunction(name=names[0])) if len(names) == 1 else "required"
    raise DialectError(f"toolConfig.functionCallingConfig.mode {calling.mode!r} is not supported", param="toolConfig")


def _response_format(config: _GenerationConfig) -> dict[str, Any] | None:
    schema = config.response_json_schema or (_json_schema(config.response_schema) if config.response_schema else None)
    if schema is not None:
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    if config.response_mime_type == "application/json":
        return {"type": "json_object"}
    return None


def _finish_reason(reason: str | None) -> str:
    return {"length": "MAX_TOKENS", "content_filter": "SAFETY"}.get(reason or "stop", "STOP")


def _usage(usage: Usage | None, prompt_tokens: int | None = None) -> dict[str, Any]:
    u = usage or Usage()
    prompt = u.prompt_tokens or prompt_tokens or 0
    out: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": u.output_tokens,
        "totalTokenCount": prompt + u.output_tokens,
    }
    if u.cached_tokens:
        out["cachedContentTokenCount"] = u.cached_tokens
    return out


def _call_part(call_id: str, name: str, arguments: str | None) -> dict[str, Any]:
    return {"functionCall": {"id": call_id, "name": name, "args": events.parse_arguments(arguments)}}


_STATUS_NAMES = {
    "invalid_request": "INVALID_ARGUMENT",
    "authentication": "UNAUTHENTICATED",
    "permission": "PERMISSION_DENIED",
    "not_found": "NOT_FOUND",
    "too_large": "INVALID_ARGUMENT",
    "rate_limit": "RESOURCE_EXHAUSTED",
    "overloaded": "UNAVAILABLE",
    "timeout": "DEADLINE_EXCEEDED",
    "upstream": "UNAVAILABLE",
    "internal": "INTERNAL",
}


class GeminiDialect(Dialect):
    name = "gemini"

    def parse_request(
        self, body: bytes | Mapping[str, Any], route: RouteInfo, memo: HistoryMemo | None = None
    ) -> ParsedRequest:
        top: _G
        if route.operation is Operation.COUNT_TOKENS:
            memo = None  # a count may wrap its request in `generateContentRequest`
            top = parse_with_memo(body, _CountTokensRequest, "contents", None, self.name).request
            parsed = MemoParsed(top.generate_content_request or GenerateContentRequest(contents=top.contents or []),
                                None, 0, [], None)
        else:
            parsed = parse_with_memo(body, GenerateContentRequest, "contents", memo, self.name)
            top = parsed.request
        req = parsed.request
        pairing = parsed.state.copy() if parsed.seen else _Pairing()
        converted = [*parsed.known, *_history(req.contents, parsed.seen, pairing)]
        system = _system_message(req.system_instruction)
        model = route.model or str((top.model_extra or {}).get("model") or "")
        if not model:
            raise DialectError("the model must be named in the path: /v1beta/models/{model}:generateContent")
        model = model.removeprefix("models/")
        config = req.generation_config or _GenerationConfig()
        if config.candidate_count not in (None, 1):
            raise DialectError("candidateCount must be 1: each rollout samples one completion", param="generationConfig.candidateCount")
        tools, dropped = parsed.convert_tools(req.tools, _tools)
        stream = bool(route.stream) and route.operation is Operation.GENERATE
        choice = _tool_choice(req.tool_config)  # validated even when no tool is left to choose
        canonical = CanonicalRequest(
            model=model,
            messages=[system, *converted] if system is not None else converted,
            tools=tools,
            tool_choice=choice if tools else None,
            max_tokens=config.max_output_tokens,
            temperature=config.temperature,
            stop=config.stop_sequences or None,
            seed=config.seed,
            stream=stream,
            response_format=_response_format(config),
        )
        if not canonical.messages and route.operation is Operation.GENERATE:
            raise DialectError("invalid request: contents is empty", param="contents")
        parsed.remember(memo, self.name, converted, pairing)
        return ParsedRequest(
            canonical=canonical, operation=route.operation, stream=stream, requested_model=model, dropped_tools=dropped
        )

    def _envelope(self, parts: list[dict[str, Any]], request: ParsedRequest, response_id: str) -> dict[str, Any]:
        return {
            "candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}],
            "modelVersion": request.requested_model,
            "responseId": response_id,
        }

    def render_response(self, completion: Completion, request: ParsedRequest) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        reason = "stop"
        for choice in completion.choices[:1]:
            msg = choice.message
            reason = choice.finish_reason or "stop"
            if msg.reasoning_text:
                parts.append({"text": msg.reasoning_text, "thought": True})
            if msg.content:
                parts.append({"text": msg.content})
            parts += [
                _call_part(c.id or new_id("call_"), c.function.name, c.function.arguments)
                for c in msg.tool_calls or []
                if c.function is not None and c.function.name
            ]
        body = self._envelope(parts or [{"text": ""}], request, new_id(""))
        body["candidates"][0]["finishReason"] = _finish_reason(reason)
        body["usageMetadata"] = _usage(completion.usage)
        body["createTime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return body

    async def render_stream(
        self, chunks: AsyncIterator[CompletionChunk], request: ParsedRequest
    ) -> AsyncIterator[bytes]:
        response_id = new_id("")
        prompt_tokens: int | None = None
        calls: dict[int, list[str]] = {}  # upstream index -> [id, name, arguments] until complete

        def flush_calls() -> list[dict[str, Any]]:
            parts = [_call_part(cid, name, args) for cid, name, args in calls.values()]
            calls.clear()
            return parts

        def chunk(parts: list[dict[str, Any]]) -> bytes:
            return sse_event(self._envelope(parts, request, response_id))

        async for event in events.stream_events(chunks):
            match event:
                case events.Started(prompt):
                    prompt_tokens = prompt
                case events.ReasoningDelta(text):
                    yield chunk([*flush_calls(), {"text": text, "thought": True}])
                case events.TextDelta(text):
                    yield chunk([*flush_calls(), {"text": text}])
                case events.ToolCallStart(index, call_id, name):
                    calls[index] = [call_id, name, ""]
                case events.ToolArgsDelta(index, text):
                    calls[index][2] += text
                case events.Finished(reason, usage):
                    body = self._envelope(flush_calls() or [{"text": ""}], request, response_id)
                    body["candidates"][0]["finishReason"] = _finish_reason(reason)
                    body["usageMetadata"] = _usage(usage, prompt_tokens)
                    yield sse_event(body)
                case events.Failed(error):
                    yield sse_event(self.error_body(error))

    def error_body(self, error: DialectError) -> dict[str, Any]:
        return {"error": {"code": error.status, "message": error.message, "status": _STATUS_NAMES[error.kind]}}

    def render_count_tokens(self, input_tokens: int) -> dict[str, Any]:
        return {"totalTokens": input_tokens}
