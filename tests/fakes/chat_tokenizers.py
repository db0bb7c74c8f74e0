"""Chat tokenisers for the scripted engine: request messages (+ tools) -> prompt token ids, reply text -> ids.

`HfChatTokenizer` is the tiny model's tokenizer and chat template, rendering exactly what vLLM renders for the same
request; `ByteChatTokenizer` needs no model (byte-level, or one id per 4 bytes for the load benchmark). Both are
prefix-stable: a replayed assistant message renders to the tokens it was sampled as.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, ClassVar, Protocol

import msgspec

_KEY_ENCODER = msgspec.json.Encoder()


class ChatTokenizer(Protocol):
    eos_id: int

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]: ...

    def encode(self, text: str) -> list[int]: ...

    def pieces(self, text: str, ids: list[int]) -> list[str]:
        """Text of each token of `ids` (= encode(text)) such that "".join(pieces) == text."""
        ...


def message_text(content: Any) -> str:
    """Content as text: a string, or the text parts of a parts array joined by newlines (as vLLM does)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    raise ValueError(f"message content must be a string or a list of parts, not {type(content).__name__}")


def tool_call_block(name: str, arguments: dict[str, Any] | str) -> str:
    """A tool call in hermes format, exactly as the Qwen2.5 template renders it back in the history."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def assistant_text(content: str | None, calls: list[tuple[str, dict[str, Any] | str]]) -> str:
    """What follows the generation prompt `<|im_start|>assistant\\n` in the template (before <|im_end|>)."""
    return "\n".join(([content] if content else []) + [tool_call_block(n, a) for n, a in calls])


def normalized_arguments(raw: Any) -> dict[str, Any] | str:
    """Arguments as vLLM hands them to the template: a JSON string is parsed, so re-spacing doesn't matter."""
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            return raw
        return parsed if isinstance(parsed, dict) else raw
    return raw if isinstance(raw, dict) else {}


def _call_functions(message: dict[str, Any]) -> list[Any]:
    """The `function` part of each of a message's tool calls: all the template reads of them (not their ids)."""
    return [
        call.get("function", call) if isinstance(call, dict) else {}
        for call in message.get("tool_calls") or []
    ]


def history_calls(message: dict[str, Any]) -> list[tuple[str, dict[str, Any] | str]]:
    return [
        (str(fn.get("name", "")), normalized_arguments(fn.get("arguments")))
        for fn in _call_functions(message)
    ]


def vllm_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as vLLM hands it to the chat template (its ChatCompletionToolsParam.model_dump(): fixed key order,
    null description/parameters kept, unset strict dropped), so the rendered prompt matches vLLM's to the token."""
    fn = tool.get("function") or {}
    function = {
        "name": fn.get("name"),
        "description": fn.get("description"),
        "parameters": fn.get("parameters"),
    }
    function |= {k: fn[k] for k in ("strict", "defer_loading") if fn.get(k) is not None}
    out: dict[str, Any] = {"type": "function", "function": function}
    if tool.get("defer_loading") is not None:
        out["defer_loading"] = tool["defer_loading"]
    return out


def _message_key(m: dict[str, Any]) -> Hashable:
    """All a message's segment renders from: (role, text) for a plain message (hashing the text is all a lookup
    costs), else the JSON of its role, content and tool calls' functions (bytes: never equal to a tuple)."""
    role, content = m.get("role"), m.get("content")
    if type(role) is str and type(content) is str and not m.get("tool_calls"):
        return (role, content)
    return _KEY_ENCODER.encode([role, content, _call_functions(m)])


def _tools_key(tools: list[dict[str, Any]]) -> Hashable:
    return _KEY_ENCODER.encode(["tools", tools])


class HfChatTokenizer:
    """The tiny model's own tokenizer and chat template: the ids vLLM would report for the same request."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.eos_id = int(self._tok.convert_tokens_to_ids("<|im_end|>"))

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        rendered = []
        for m in messages:
            msg: dict[str, Any] = {"role": m.get("role"), "content": message_text(m.get("content"))}
            if m.get("tool_calls"):
                msg["tool_calls"] = [
                    {"type": "function", "function": {"name": n, "arguments": a}} for n, a in history_calls(m)
                ]
            rendered.append(msg)
        text = self._tok.apply_chat_template(
            rendered,
            tools=[vllm_tool(t) for t in tools] if tools else None,
            add_generation_prompt=True,
            tokenize=False,
        )
        return list(self._tok.encode(text, add_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def pieces(self, text: str, ids: list[int]) -> list[str]:
        out, prev = [], ""
        for i in range(1, len(ids) + 1):
            decoded = self._tok.decode(ids[:i])
            out.append(decoded[len(prev) :])
            prev = decoded
        return out


class ByteChatTokenizer:
    """Byte-level stand-in without a model: one id per `stride` UTF-8 bytes (id = first byte). stride=1 is exact
    byte tokenisation; stride=4 ("fast") gives ~real BPE token counts at C speed, for the load benchmark.

    A message is [role id] + its bytes + [end id]; tools are one leading segment. Ids 256+ are the markers.

    Segments are memoised by what they render from (a message's role, content and tool calls' functions; the tools
    list), as a prefix cache would: a harness replays its whole history every turn, so only the new messages of a
    call are tokenised. The memo keeps the `memo_size` latest segments (tool results recur across sessions too)."""

    ROLE_IDS: ClassVar[dict[str, int]] = {
        "system": 256,
        "user": 257,
        "assistant": 258,
        "tool": 259,
        "tools": 260,
    }
    END = 261

    def __init__(self, stride: int = 1, memo_size: int = 8192) -> None:
        self.stride = stride
        self.eos_id = self.END
        self.memo_size = memo_size
        self._memo: dict[Hashable, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8")[:: self.stride])

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        ids: list[int] = []
        if tools:
            ids += self._memoised(_tools_key, self._tools_segment, tools)
        for m in messages:
            ids += self._memoised(_message_key, self._message_segment, m)
        ids.append(self.ROLE_IDS["assistant"])
        return ids

    def _memoised(
        self, key_of: Callable[[Any], Hashable], segment: Callable[[Any], list[int]], source: Any
    ) -> list[int]:
        try:
            key = key_of(source)
        except TypeError:  # not JSON (only possible in process): rendering reports it in its own terms
            return segment(source)
        ids = self._memo.get(key)
        if ids is None:
            ids = self._memo[key] = segment(source)
            if len(self._memo) > self.memo_size:
                del self._memo[next(iter(self._memo))]
        return ids

    def _tools_segment(self, tools: list[dict[str, Any]]) -> list[int]:
        return [self.ROLE_IDS["tools"], *self.encode(json.dumps(tools, sort_keys=True)), self.END]

    def _message_segment(self, m: dict[str, Any]) -> list[int]:
        role = str(m.get("role"))
        text = message_text(m.get("content"))
        if role == "assistant":
            text = assistant_text(text, history_calls(m))
        return [self.ROLE_IDS.get(role, self.ROLE_IDS["user"]), *self.encode(text), self.END]

    def pieces(self, text: str, ids: list[int]) -> list[str]:
        data = text.encode("utf-8")
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return [
            decoder.decode(data[i : i + self.stride], final=i + self.stride >= len(data))
            for i in range(0, len(data), self.stride)
        ]


def make_tokenizer(kind: str, model_dir: str | None = None) -> ChatTokenizer:
    if kind == "tiny":
        if not model_dir:
            raise ValueError("tokenizer 'tiny' needs the tiny model's directory")
        return HfChatTokenizer(model_dir)
    if kind == "bytes":
        return ByteChatTokenizer(stride=1)
    if kind == "fast":
        return ByteChatTokenizer(stride=4)
    raise ValueError(f"unknown tokenizer {kind!r}: expected tiny, bytes or fast")
