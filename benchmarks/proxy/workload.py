"""What one simulated agent session sends and how it reads the answers, in each of the four dialects. Pure.

A session is a coding-agent loop: a system prompt, one shell tool, a task; every turn the model answers with a
tool call (the engine stand-in is scripted to), the harness appends that call and a ~500-token tool result, and
sends the whole history again. So the context grows by ~500 tokens a turn, as it does for a real harness.
Anthropic sessions send what Claude Code sends: content as blocks, and one prompt-cache marker (`cache_control`)
on the newest message's last block, so the message that carried it is resent without it on the next call.

Bodies are kept as pre-serialised JSON segments (`History`): each message is encoded once, when it is appended,
and a call's body is a join of bytes, so the load generator's own cost per call stays small and flat while the
context grows to thousands of tokens (the client must not be what saturates).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import msgspec

Dialect = Literal["openai_chat", "openai_responses", "anthropic", "gemini"]
DIALECTS: tuple[Dialect, ...] = ("openai_chat", "openai_responses", "anthropic", "gemini")

# The tool call the engine stand-in is scripted to make on every turn (see `engine_script`).
TOOL_NAME = "shell"
TOOL_COMMAND = "python -m pytest -q tests/"
TOOL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"command": {"type": "string", "description": "the command line to run"}},
    "required": ["command"],
}
TOOL_DESCRIPTION = "Run a shell command in the task's sandbox and return its output."


# `--tools N` of run.py, stages.py and floor.py: what `tool_specs(N)` sends.
TOOLS_HELP = (
    "tool definitions each session sends (the shell tool, then ~1.5 KB ones; a captured Claude Code request "
    "carried 30)"
)


def tool_specs(count: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, description, JSON schema) of a session's tools: the shell tool the engine stand-in calls, then
    `count` - 1 more of about the size real harnesses send (~1.5 KB each; a captured Claude Code request carried
    30)."""
    more = [
        (f"tool_{i}", f"Tool {i} of the harness. " + "It reads and edits files in the task's repository. " * 20,
         {"type": "object", "required": ["path"],
          "properties": {p: {"type": "string", "description": f"the {p} to work on"} for p in
                         ("path", "pattern", "content", "mode")}})
        for i in range(1, count)
    ]
    return [(TOOL_NAME, TOOL_DESCRIPTION, TOOL_PARAMETERS), *more]
SYSTEM_PROMPT = (
    "You are a coding agent working in a sandboxed repository. Use the shell tool to inspect files, run the "
    "tests and edit code until the task is solved. Keep answers short; prefer running commands over guessing. "
) * 6
TASK = "The test suite fails in tests/test_parser.py. Find the bug in src/parser.py and fix it."

# The stand-in's "fast" tokenizer makes one token of 4 UTF-8 bytes, about what a real BPE tokenizer gives on
# English and code, so ~500 tokens of tool output are ~2,000 characters.
BYTES_PER_TOKEN = 4

_WORDS = [
    "tests/test_parser.py::test_case",
    "PASSED",
    "FAILED",
    "assert",
    "expected",
    "got",
    "None",
    "line",
    "def",
    "return",
    "self",
    "value",
    "import",
    "from",
    "error",
    "Traceback",
    "File",
    "src/parser.py",
    "in",
    "parse",
    "token",
    "index",
    "raise",
    "ValueError",
    "ok",
    "collected",
    "items",
    "warnings",
    "summary",
    "short",
    "test",
    "info",
    "=",
    "==",
    "!=",
    "0",
    "1",
    "2",
    "3",
    "42",
    "100",
    "True",
    "False",
    "[",
    "]",
    "(",
    ")",
    ":",
    ",",
    ".",
]


def tool_output(seed: int, tokens: int) -> str:
    """~`tokens` tokens of test-runner-like output, deterministic per seed (distinct text per turn, so no two
    tool results share a prefix beyond what the conversation itself shares)."""
    rng = random.Random(seed)
    target = tokens * BYTES_PER_TOKEN
    lines: list[str] = []
    size = 0
    while size < target:
        line = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 14)))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:target]


def _dumps(obj: Any) -> bytes:
    return msgspec.json.encode(obj)  # compact UTF-8 JSON, ~10x faster than json.dumps for a tool result


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the OpenAI shapes carry it


@dataclass(frozen=True)
class Reply:
    """What the load generator needs from a model answer: the tool calls to replay in the history."""

    tool_calls: list[ToolCall]


class ReplyError(ValueError):
    """The answer is not a well-formed reply in the dialect that was asked for."""


@dataclass
class History:
    """A session's request body as JSON segments: `head` + ",".join(items) + `tail`; with `cache_marker`, the last
    item is sent as `last_marked`, which carries Claude Code's sliding prompt-cache marker."""

    head: bytes
    tail: bytes
    items: list[bytes] = field(default_factory=list)
    cache_marker: bool = False
    last_marked: bytes = b""

    def body(self) -> bytes:
        if not self.cache_marker:
            return self.head + b",".join(self.items) + self.tail
        earlier = b",".join(self.items[:-1])
        return self.head + earlier + (b"," if earlier else b"") + self.last_marked + self.tail

    def append(self, *messages: Any) -> None:
        self.items.extend(_dumps(m) for m in messages)
        if self.cache_marker:
            last = messages[-1]
            marked = {**last["content"][-1], "cache_control": {"type": "ephemeral"}}
            self.last_marked = _dumps({**last, "content": [*last["content"][:-1], marked]})


# --------------------------------------------------------------------------------------------- the requests


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    body: bytes


class SessionWorkload:
    """One session's conversation in one dialect. `baseline` sends what the proxy would send the engine: the
    OpenAI-chat body plus `upstream_fields` (token ids, logprobs, neutral sampling), straight to the engine."""

    def __init__(
        self,
        dialect: Dialect,
        stream: bool,
        key: str,
        model: str,
        *,
        baseline_fields: dict[str, Any] | None = None,
        tools: int = 1,
    ) -> None:
        self.dialect: Dialect = "openai_chat" if baseline_fields is not None else dialect
        self.stream = stream
        self.key = key
        self.model = model
        self.tools = tool_specs(tools)
        self.history = self._start(baseline_fields)

    # -- the body's fixed parts and first messages

    def _start(self, baseline_fields: dict[str, Any] | None) -> History:
        head: dict[str, Any]
        if self.dialect == "openai_chat":
            head = {
                "model": self.model,
                "stream": self.stream,
                "max_tokens": 1024,
                "tools": [
                    {"type": "function", "function": {"name": n, "description": d, "parameters": p}}
                    for n, d, p in self.tools
                ],
                **(baseline_fields or {}),
            }
            if baseline_fields is not None:
                head["stream"] = self.stream
                if not self.stream:
                    head.pop("stream_options", None)
            history = _history(head, "messages")
            history.append({"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": TASK})
        elif self.dialect == "openai_responses":
            head = {
                "model": self.model,
                "stream": self.stream,
                "instructions": SYSTEM_PROMPT,
                "max_output_tokens": 1024,
                "tools": [{"type": "function", "name": n, "description": d, "parameters": p} for n, d, p in self.tools],
            }
            history = _history(head, "input")
            history.append({"role": "user", "content": TASK})
        elif self.dialect == "anthropic":
            head = {
                "model": self.model,
                "max_tokens": 1024,
                "stream": self.stream,
                "system": [{"type": "text", "text": SYSTEM_PROMPT, "cache_control": {"type": "ephemeral"}}],
                "tools": [{"name": n, "description": d, "input_schema": p} for n, d, p in self.tools],
            }
            history = _history(head, "messages", cache_marker=True)
            history.append({"role": "user", "content": [{"type": "text", "text": TASK}]})
        else:
            head = {
                "systemInstruction": {"parts": [{"text": SYSTEM_PROMPT}]},
                "tools": [
                    {"functionDeclarations": [{"name": n, "description": d, "parameters": p} for n, d, p in self.tools]}
                ],
                "generationConfig": {"maxOutputTokens": 1024},
            }
            history = _history(head, "contents")
            history.append({"role": "user", "parts": [{"text": TASK}]})
        return history

    def request(self) -> Request:
        return Request(self._path(), self._headers(), self.history.body())

    def _path(self) -> str:
        if self.dialect == "openai_chat":
            return "/v1/chat/completions"
        if self.dialect == "openai_responses":
            return "/v1/responses"
        if self.dialect == "anthropic":
            return "/v1/messages"
        action = "streamGenerateContent?alt=sse" if self.stream else "generateContent"
        return f"/v1beta/models/{self.model}:{action}"

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self.dialect == "anthropic":
            headers["x-api-key"] = self.key
            headers["anthropic-version"] = "2023-06-01"
        elif self.dialect == "gemini":
            headers["x-goog-api-key"] = self.key
        elif self.key:
            headers["authorization"] = f"Bearer {self.key}"
        return headers

    # -- the turn's reply and tool result go into the history

    def record_turn(self, reply: Reply, output: str) -> None:
        if not reply.tool_calls:
            raise ReplyError("the reply has no tool call (the engine stand-in is scripted to make one)")
        calls = reply.tool_calls
        if self.dialect == "openai_chat":
            self.history.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments},
                        }
                        for c in calls
                    ],
                },
                *({"role": "tool", "tool_call_id": c.id, "content": output} for c in calls),
            )
        elif self.dialect == "openai_responses":
            self.history.append(
                *(
                    {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
                    for c in calls
                ),
                *({"type": "function_call_output", "call_id": c.id, "output": output} for c in calls),
            )
        elif self.dialect == "anthropic":
            self.history.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments)}
                        for c in calls
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": c.id, "content": output} for c in calls
                    ],
                },
            )
        else:
            self.history.append(
                {
                    "role": "model",
                    "parts": [
                        {"functionCall": {"name": c.name, "args": json.loads(c.arguments)}} for c in calls
                    ],
                },
                {
                    "role": "user",
                    "parts": [
                        {"functionResponse": {"name": c.name, "response": {"output": output}}} for c in calls
                    ],
                },
            )

    # -- reading answers

    def parse(self, raw: bytes) -> Reply:
        """A non-streamed answer."""
        try:
            body = _BODY_DECODERS[self.dialect].decode(raw)
            return Reply(body.calls())
        except msgspec.ValidationError as exc:
            raise ReplyError(f"unexpected {self.dialect} answer shape ({exc})") from None
        except msgspec.DecodeError as exc:
            raise ReplyError(f"answer is not JSON: {exc}") from None
        except IndexError:
            raise ReplyError(f"unexpected {self.dialect} answer shape (no choice or candidate)") from None

    def stream_reader(self) -> StreamReader:
        return StreamReader(self.dialect)

    def parse_stream(self, raw: bytes) -> Reply:
        """A streamed answer, read to its end."""
        reader = self.stream_reader()
        reader.feed_body(raw)
        return reader.finish()


def _history(head: dict[str, Any], list_key: str, *, cache_marker: bool = False) -> History:
    """Split `{..head, list_key: [...]}` around the list so items can be appended without re-encoding."""
    encoded = _dumps({**head, list_key: []})
    marker = f'"{list_key}":[]'.encode()
    cut = encoded.rindex(marker) + len(marker) - 1
    return History(head=encoded[:cut], tail=encoded[cut:], cache_marker=cache_marker)


# The parts of each dialect's non-streamed answer that a session reads, as msgspec structs: decoding skips the
# rest without building it (the engine's own answer, the baseline's, carries ~10k prompt token ids).


class _Function(msgspec.Struct):
    name: str
    arguments: str


class _ChatToolCall(msgspec.Struct):
    id: str
    function: _Function


class _ChatMessage(msgspec.Struct):
    tool_calls: list[_ChatToolCall] | None = None


class _ChatChoice(msgspec.Struct):
    message: _ChatMessage


class _ChatBody(msgspec.Struct):
    choices: list[_ChatChoice]

    def calls(self) -> list[ToolCall]:
        message = self.choices[0].message
        return [ToolCall(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]


class _ResponsesItem(msgspec.Struct):
    type: str = ""
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None


class _ResponsesBody(msgspec.Struct):
    output: list[_ResponsesItem]

    def calls(self) -> list[ToolCall]:
        return [
            ToolCall(str(c.call_id), str(c.name), str(c.arguments))
            for c in _complete(self.output, "function_call", ("call_id", "name", "arguments"))
        ]


class _AnthropicBlock(msgspec.Struct):
    type: str = ""
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None


class _AnthropicBody(msgspec.Struct):
    content: list[_AnthropicBlock]

    def calls(self) -> list[ToolCall]:
        return [
            ToolCall(str(b.id), str(b.name), json.dumps(b.input))
            for b in _complete(self.content, "tool_use", ("id", "name", "input"))
        ]


def _complete(items: list[Any], kind: str, fields: tuple[str, ...]) -> list[Any]:
    """The items of type `kind`, each of which must carry `fields` (optional on the other items)."""
    calls = [item for item in items if item.type == kind]
    if any(getattr(c, name) is None for c in calls for name in fields):
        raise ReplyError(f"a {kind} item lacks one of {', '.join(fields)}")
    return calls


class _GeminiCall(msgspec.Struct):
    name: str
    id: str | None = None
    args: dict[str, Any] | None = None


class _GeminiPart(msgspec.Struct):
    function_call: _GeminiCall | None = msgspec.field(default=None, name="functionCall")


class _GeminiContent(msgspec.Struct):
    parts: list[_GeminiPart]


class _GeminiCandidate(msgspec.Struct):
    content: _GeminiContent


class _GeminiBody(msgspec.Struct):
    candidates: list[_GeminiCandidate]

    def calls(self) -> list[ToolCall]:
        parts = self.candidates[0].content.parts
        return [
            ToolCall(call.id or f"call_{i}", call.name, json.dumps(call.args or {}))
            for i, call in enumerate(p.function_call for p in parts)
            if call is not None
        ]


_BODY_DECODERS: dict[Dialect, msgspec.json.Decoder[Any]] = {
    "openai_chat": msgspec.json.Decoder(_ChatBody),
    "openai_responses": msgspec.json.Decoder(_ResponsesBody),
    "anthropic": msgspec.json.Decoder(_AnthropicBody),
    "gemini": msgspec.json.Decoder(_GeminiBody),
}


class StreamReader:
    """Reads a dialect's SSE answer line by line into a `Reply`; `finish()` fails unless the stream ended the
    way that dialect ends a complete answer."""

    # Only events holding one of these are decoded: the client's CPU per call stays small (the engine's first
    # streamed chunk alone carries the whole prompt's token ids), and the rest carries nothing the session needs.
    _WANTED: ClassVar[dict[str, tuple[bytes, ...]]] = {
        "openai_chat": (b'"tool_calls"',),
        "openai_responses": (b"response.output_item.done", b"response.completed"),
        "anthropic": (b"content_block_start", b"input_json_delta", b"message_stop"),
        "gemini": (b"functionCall", b"finishReason"),
    }

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.done = False
        self._calls: dict[int, dict[str, str]] = {}
        self._error: str | None = None
        self._wanted = (b'"error"', *self._WANTED[dialect])

    def feed(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        if not any(marker in payload for marker in self._wanted):
            return
        try:
            event = json.loads(payload)
        except ValueError:
            raise ReplyError(f"unreadable SSE data line: {payload[:120]!r}") from None
        if isinstance(event, dict) and ("error" in event or event.get("type") == "error"):
            self._error = json.dumps(event)[:300]
            self.done = True
            return
        try:
            getattr(self, f"_feed_{self.dialect}")(event)
        except (KeyError, IndexError, TypeError) as exc:
            raise ReplyError(f"unexpected {self.dialect} stream event ({exc!r})") from None

    def feed_body(self, raw: bytes) -> None:
        """Feed a whole stream, in order, but only its lines that hold a marker `feed` acts on: they are found with
        `bytes.find`, so the others (most of a stream, the engine's ~50 KB prompt-ids event among them) are never
        split out, copied or looked at in Python."""
        starts: set[int] = set()
        for marker in (*self._wanted, b"[DONE]"):
            at = raw.find(marker)
            while at >= 0:
                starts.add(raw.rfind(b"\n", 0, at) + 1)
                end = raw.find(b"\n", at)
                at = raw.find(marker, end) if end >= 0 else -1
        for start in sorted(starts):
            end = raw.find(b"\n", start)
            self.feed(raw[start : end if end >= 0 else len(raw)])

    def _call(self, index: int) -> dict[str, str]:
        return self._calls.setdefault(index, {"id": "", "name": "", "arguments": ""})

    def _feed_openai_chat(self, event: dict[str, Any]) -> None:
        for choice in event.get("choices") or []:
            for delta in (choice.get("delta") or {}).get("tool_calls") or []:
                call = self._call(int(delta.get("index", 0)))
                call["id"] = delta.get("id") or call["id"]
                fn = delta.get("function") or {}
                call["name"] = fn.get("name") or call["name"]
                call["arguments"] += fn.get("arguments") or ""

    def _feed_openai_responses(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "response.output_item.done" and event["item"].get("type") == "function_call":
            item = event["item"]
            self._calls[len(self._calls)] = {
                "id": item["call_id"],
                "name": item["name"],
                "arguments": item["arguments"],
            }
        elif kind == "response.completed":
            self.done = True

    def _feed_anthropic(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "content_block_start" and event["content_block"].get("type") == "tool_use":
            block = event["content_block"]
            self._calls[int(event["index"])] = {"id": block["id"], "name": block["name"], "arguments": ""}
        elif kind == "content_block_delta" and event["delta"].get("type") == "input_json_delta":
            self._call(int(event["index"]))["arguments"] += event["delta"].get("partial_json", "")
        elif kind == "message_stop":
            self.done = True

    def _feed_gemini(self, event: dict[str, Any]) -> None:
        for candidate in event.get("candidates") or []:
            for part in (candidate.get("content") or {}).get("parts") or []:
                if "functionCall" in part:
                    fc = part["functionCall"]
                    self._calls[len(self._calls)] = {
                        "id": fc.get("id") or f"call_{len(self._calls)}",
                        "name": fc["name"],
                        "arguments": json.dumps(fc.get("args") or {}),
                    }
            if candidate.get("finishReason"):
                self.done = True

    def finish(self) -> Reply:
        if self._error is not None:
            raise ReplyError(f"in-stream error: {self._error}")
        if not self.done:
            raise ReplyError(f"{self.dialect} stream ended before its final event")
        return Reply(
            [ToolCall(c["id"], c["name"], c["arguments"] or "{}") for _, c in sorted(self._calls.items())]
        )


# --------------------------------------------------------------------------------------------- the mix


@dataclass(frozen=True)
class SessionPlan:
    """Which dialect and streaming mode session `index` uses: dialects round-robin, and within each dialect
    sessions alternate streaming / not (the first `stream_fraction` of every 2×4 block streams)."""

    index: int
    dialect: Dialect
    stream: bool

    @classmethod
    def of(cls, index: int, stream_fraction: float) -> SessionPlan:
        dialect = DIALECTS[index % len(DIALECTS)]
        # A low-discrepancy split so any prefix of the sessions has about the requested streaming share.
        rank = (index // len(DIALECTS)) * 0.6180339887498949 % 1.0
        return cls(index, dialect, rank < stream_fraction)


def output_seed(session: int, turn: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{session}:{turn}".encode(), digest_size=4).digest(), "big")
