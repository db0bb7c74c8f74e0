"""vLLM 0.32's OpenAI chat-completions wire shapes (non-streaming body, SSE chunks, errors), field for field.

Used by the scripted engine; the shapes are checked against a live vLLM in tests/integration/test_engine_vllm.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

SYSTEM_FINGERPRINT = "vllm-0.32.0-scripted"
COMPACT = (",", ":")  # vLLM serialises with pydantic: no spaces

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()


def encode_json(obj: Any) -> bytes:
    """`json.dumps(obj, separators=COMPACT).encode()`, byte for byte, at C speed (a body carries up to ~10k prompt
    ids: json.dumps alone took ~1 ms for them). msgspec writes the same JSON for ASCII text, ints, bools, None and
    floats in plain notation (1e-4 <= |x| < 1e16; this engine's only floats are logprobs in [-3.01, -0.01]); text
    that json.dumps would escape (non-ASCII, DEL) comes out differently, so such a body takes json.dumps."""
    out = _ENCODER.encode(obj)
    if out.isascii() and b"\x7f" not in out:
        return out
    return json.dumps(obj, separators=COMPACT).encode()


def decode_json(raw: bytes) -> Any:
    """`json.loads(raw)` at C speed; what msgspec refuses (malformed JSON, NaN, lone surrogates) goes to json.loads,
    which parses it the same way or raises its usual JSONDecodeError."""
    try:
        return _DECODER.decode(raw)
    except msgspec.DecodeError:
        return json.loads(raw)


@dataclass(frozen=True, slots=True)
class Completion:
    """A scripted reply rendered into tokens (internal: a dataclass, so long prompts cost no validation)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    pieces: list[str]
    logprobs: list[float]
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    delay_s: float = 0.0


class VllmError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}
        }


def _logprob_entries(c: Completion, start: int, end: int) -> list[dict[str, Any]]:
    return [
        {
            "token": c.pieces[i],
            "logprob": c.logprobs[i],
            "bytes": list(c.pieces[i].encode("utf-8")),
            "top_logprobs": [],
        }
        for i in range(start, end)
    ]


def chat_response(c: Completion, request: dict[str, Any], request_id: str, created: int) -> dict[str, Any]:
    """The non-streaming body, field for field as vLLM 0.32 serialises ChatCompletionResponse."""
    want_ids = bool(request.get("return_token_ids"))
    message: dict[str, Any] = {
        "role": "assistant",
        "content": c.content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if c.tool_calls:
        message["tool_calls"] = c.tool_calls
    message["reasoning"] = None
    n_prompt, n_out = len(c.prompt_ids), len(c.completion_ids)
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": request["model"],
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": {"content": _logprob_entries(c, 0, n_out)} if request.get("logprobs") else None,
                "finish_reason": c.finish_reason,
                "stop_reason": None,
                "token_ids": c.completion_ids if want_ids else None,
                "routed_experts": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": {
            "prompt_tokens": n_prompt,
            "total_tokens": n_prompt + n_out,
            "completion_tokens": n_out,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
        "prompt_logprobs": None,
        "prompt_token_ids": c.prompt_ids if want_ids else None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def _token_deltas(c: Completion) -> list[dict[str, Any]]:
    """The `delta` of each sampled token's chunk: the content streams as text; a tool call streams as an id+name
    delta on its first token and an arguments delta on its last; the rest (hermes markup, the stop token) carry
    empty deltas, as vLLM's hermes streaming parser emits them."""
    starts: list[int] = []
    offset = 0
    for piece in c.pieces:
        starts.append(offset)
        offset += len(piece)
    text = "".join(c.pieces)
    content_end = len(c.content or "") if c.tool_calls else len(text)
    deltas: list[dict[str, Any]] = []
    for start, piece in zip(starts, c.pieces, strict=True):
        portion = text[start : min(start + len(piece), content_end)]
        deltas.append({"content": portion} if portion else {})
    if c.finish_reason != "length":
        deltas[-1] = {}
    search_from = 0
    for k, call in enumerate(c.tool_calls):
        begin = text.index("<tool_call>", search_from)
        search_from = text.index("</tool_call>", begin) + len("</tool_call>")
        first = max(i for i, o in enumerate(starts) if o <= begin)
        last = max(i for i, o in enumerate(starts) if o < search_from)
        name = {
            "id": call["id"],
            "type": "function",
            "index": k,
            "function": {"name": call["function"]["name"]},
        }
        args = {"index": k, "function": {"arguments": call["function"]["arguments"]}}
        if first == last:
            name["function"] |= args["function"]
        else:
            deltas[last] = {"content": None, "tool_calls": [args]}
        # With coarse tokens the first call's token may also hold the end of the content.
        deltas[first] = {"content": deltas[first].get("content") or None, "tool_calls": [name]}
    return deltas


def stream_chunks(
    c: Completion, request: dict[str, Any], request_id: str, created: int
) -> Iterator[dict[str, Any]]:
    """The SSE chunk bodies, as vLLM 0.32 streams them (exclude-unset serialisation): a role chunk carrying
    `prompt_token_ids`, one chunk per sampled token with its `token_ids` and logprobs, and a usage chunk when
    `stream_options.include_usage` is set."""
    want_ids = bool(request.get("return_token_ids"))
    want_logprobs = bool(request.get("logprobs"))
    include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
    base = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": request["model"],
    }
    first: dict[str, Any] = base | {
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ]
    }
    if want_ids:
        first |= {"prompt_token_ids": c.prompt_ids, "prompt_text": None}
    yield first
    n = len(c.completion_ids)
    for i, delta in enumerate(_token_deltas(c)):
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": {"content": _logprob_entries(c, i, i + 1)} if want_logprobs else None,
            "finish_reason": c.finish_reason if i == n - 1 else None,
        }
        if i == n - 1:
            choice["stop_reason"] = None
        if want_ids:
            choice["token_ids"] = [c.completion_ids[i]]
        chunk = base | {"choices": [choice]}
        if i == n - 1 and not include_usage:
            # vLLM stamps the fingerprint on the terminal chunk, or on the usage chunk when there is one.
            chunk["system_fingerprint"] = SYSTEM_FINGERPRINT
        yield chunk
    if include_usage:
        n_prompt = len(c.prompt_ids)
        yield base | {
            "choices": [],
            "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n, "completion_tokens": n},
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }


def sse_events(c: Completion, request: dict[str, Any], request_id: str, created: int) -> Iterator[bytes]:
    """The stream's bytes, one SSE event per chunk of `stream_chunks`, then `data: [DONE]`."""
    for chunk in stream_chunks(c, request, request_id, created):
        yield b"data: " + encode_json(chunk) + b"\n\n"
    yield b"data: [DONE]\n\n"
