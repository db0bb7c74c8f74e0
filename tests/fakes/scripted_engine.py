"""A scripted stand-in for vLLM's OpenAI server, for tests and the proxy load benchmark.

It is not an inference engine: each chat completion returns the next scripted reply (text, or tool calls), but in
vLLM 0.32's exact wire shape — `prompt_token_ids` at the top level, `choices[i].token_ids`, sampled `logprobs`,
hermes-parsed `tool_calls`, vLLM's SSE chunking with per-chunk `token_ids` and the final usage chunk — so the proxy
and the harness CLIs behind it cannot tell it from the real server. Token ids are deterministic and prefix-stable:
the prompt of a follow-up call starts with the previous prompt + completion whenever the history is replayed as sent.

Replies are chosen per request by rules (`ScriptedReply.when_*`), which keeps concurrent sessions and side calls
(e.g. a harness's title-generation call without tools) from consuming each other's replies.

Tokenisation lives in `chat_tokenizers`, the wire shapes in `vllm_wire`; this module holds the script, the engine
and its HTTP surface. Run standalone (e.g. for the benchmark):
`python -m tests.fakes.scripted_engine --port 8100 --tokenizer fast`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import socket
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.fakes.chat_tokenizers import (
    ByteChatTokenizer,
    ChatTokenizer,
    HfChatTokenizer,
    assistant_text,
    make_tokenizer,
    message_text,
    normalized_arguments,
)
from tests.fakes.vllm_wire import (
    Completion,
    VllmError,
    chat_response,
    decode_json,
    encode_json,
    sse_events,
    stream_chunks,
)

# Re-exported: tests and the benchmark import these from here.
__all__ = [
    "ByteChatTokenizer",
    "Completion",
    "HfChatTokenizer",
    "Script",
    "ScriptError",
    "ScriptedCall",
    "ScriptedEngine",
    "ScriptedEngineServer",
    "ScriptedReply",
    "ScriptedToolCall",
    "VllmError",
    "chat_response",
    "create_app",
    "main",
    "make_tokenizer",
    "stream_chunks",
]


class ScriptedToolCall(BaseModel):
    """A tool call to emit. `name` may list candidates: the first one the request offers is used, so one script
    serves harnesses whose shell tool is called differently (Bash, shell, run_shell_command, ...)."""

    model_config = ConfigDict(extra="forbid")

    name: str | list[str]
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    # False: called as named even where the request does not offer it (a model calling another harness's tool).
    offered_only: bool = True


class ScriptedReply(BaseModel):
    """One scripted answer and the requests it applies to. Matchers left as None match anything."""

    model_config = ConfigDict(extra="forbid")

    content: str | None = None
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    when_tools: bool | None = Field(
        default=None, description="request offers tools (True) / offers none (False)"
    )
    when_last_role: Literal["system", "user", "assistant", "tool"] | None = None
    when_contains: str | None = Field(default=None, description="substring of some message's text")
    max_uses: int | None = Field(default=None, ge=1, description="None: reusable")
    delay_s: float = Field(default=0.0, ge=0.0, le=600.0, description="wait before answering")


class Script(BaseModel):
    """Replies in priority order; the first matching reply with uses left answers. `default` answers otherwise."""

    model_config = ConfigDict(extra="forbid")

    replies: list[ScriptedReply] = Field(default_factory=list)
    default: ScriptedReply | None = ScriptedReply(content="Done.")


class ScriptError(ValueError):
    """The script cannot answer this request (answered as a 400 in vLLM's error shape)."""


class ScriptedCall(BaseModel):
    """What one call received and returned; tests compare it with what the proxy captured."""

    request: dict[str, Any]
    model: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@functools.lru_cache(maxsize=1 << 16)  # a reply's tokens recur call after call
def token_logprob(prev: int, token: int) -> float:
    """A deterministic 'sampled logprob' in [-3, -0.01]: stable across runs, prefix-independent."""
    return -0.01 - (zlib.crc32(f"{prev}:{token}".encode()) % 300) / 100.0


_ID_SOURCE = random.Random()  # seeded from os.urandom; ids only need to be unique, not secret


def random_id() -> str:
    """16 hex digits, as vLLM's request and tool call ids carry (without a getrandom syscall per id)."""
    return f"{_ID_SOURCE.getrandbits(64):016x}"


class ScriptedEngine:
    """Script state + rendering. Thread-safe: tests set scripts from their thread while the server answers."""

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        model: str = "tiny",
        max_model_len: int = 32768,
        record_calls: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.model = model
        self.max_model_len = max_model_len
        self.adapters: dict[str, str] = {}
        self.record_calls = record_calls
        self.calls: deque[ScriptedCall] = deque(maxlen=10_000)
        self._lock = threading.Lock()
        self._script = Script()
        self._uses: list[int] = []
        self._reply_memo: dict[str, tuple[list[int], list[str]]] = {}

    def set_script(self, script: Script | list[ScriptedReply]) -> None:
        script = script if isinstance(script, Script) else Script(replies=script)
        with self._lock:
            self._script, self._uses = script, [0] * len(script.replies)

    # -- reply selection

    def _pick(self, request: dict[str, Any]) -> ScriptedReply:
        messages = request.get("messages") or []
        has_tools = bool(request.get("tools"))
        last_role = messages[-1].get("role") if messages else None
        with self._lock:
            for i, reply in enumerate(self._script.replies):
                if reply.max_uses is not None and self._uses[i] >= reply.max_uses:
                    continue
                if reply.when_tools is not None and reply.when_tools != has_tools:
                    continue
                if reply.when_last_role is not None and reply.when_last_role != last_role:
                    continue
                if reply.when_contains is not None and not any(
                    reply.when_contains in message_text(m.get("content")) for m in messages
                ):
                    continue
                self._uses[i] += 1
                return reply
            if self._script.default is None:
                raise ScriptError("no scripted reply matches this request and the script has no default")
            return self._script.default

    # -- one call

    def complete(self, request: dict[str, Any]) -> Completion:
        model = request.get("model")
        if model != self.model and model not in self.adapters:
            valid = ", ".join([self.model, *self.adapters])
            raise VllmError(
                404, f"The model `{model}` does not exist. Valid aliases: {valid}.", "NotFoundError", "model"
            )
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise VllmError(400, "messages: a non-empty list is required", "BadRequestError", "messages")
        tools = request.get("tools") or None
        try:
            prompt_ids = self.tokenizer.prompt_ids(messages, tools)
        # Malformed messages get a 400, as vLLM's request validation gives.
        except (ValueError, TypeError, AttributeError) as exc:
            raise VllmError(400, f"messages: {exc}", "BadRequestError", "messages") from exc
        if len(prompt_ids) > self.max_model_len:
            raise VllmError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt contains "
                f"at least {len(prompt_ids)} input tokens, which exceeds this limit even without any output tokens. "
                f"Please reduce the length of the input prompt. (parameter=input_tokens, value={len(prompt_ids)})",
                "BadRequestError",
                "input_tokens",
            )
        reply = self._pick(request)
        # Arguments come back as vLLM's hermes parser re-serialises them (and as the template replays them).
        calls = [(self._tool_name(c, tools), normalized_arguments(c.arguments)) for c in reply.tool_calls]
        text = assistant_text(reply.content, calls)
        ids, pieces = self._reply_tokens(text)
        max_tokens = request.get("max_completion_tokens") or request.get("max_tokens")
        budget = min(self.max_model_len - len(prompt_ids), max_tokens or self.max_model_len)
        if len(ids) + 1 > budget:
            # Cut off like a real engine: no stop token, no parsed tool call.
            ids, pieces = ids[:budget], pieces[:budget]
            content: str | None = "".join(pieces)
            tool_calls: list[dict[str, Any]] = []
            finish = "length"
        else:
            ids, pieces = [*ids, self.tokenizer.eos_id], [*pieces, ""]
            # vLLM's hermes parser would also return the "\n" before <tool_call>; leaving it out lets a harness
            # that replays this message reproduce the same prompt tokens (the template adds it back).
            content = reply.content if calls else text
            tool_calls = [
                {
                    "id": f"chatcmpl-tool-{random_id()}",
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
                    },
                }
                for name, args in calls
            ]
            finish = "tool_calls" if tool_calls else "stop"
        prev = prompt_ids[-1] if prompt_ids else 0
        logprobs = []
        for tok in ids:
            logprobs.append(token_logprob(prev, tok))
            prev = tok
        completion = Completion(
            prompt_ids=prompt_ids,
            completion_ids=ids,
            pieces=pieces,
            logprobs=logprobs,
            content=content or None,
            tool_calls=tool_calls,
            finish_reason=finish,
            delay_s=reply.delay_s,
        )
        if self.record_calls:
            self.calls.append(
                ScriptedCall(
                    request=request,
                    model=str(model),
                    prompt_ids=prompt_ids,
                    completion_ids=ids,
                    logprobs=logprobs,
                    finish_reason=finish,
                )
            )
        return completion

    def _reply_tokens(self, text: str) -> tuple[list[int], list[str]]:
        """A reply's ids and their texts, memoised: the script's replies recur (the lists are never mutated)."""
        tokens = self._reply_memo.get(text)
        if tokens is None:
            if len(self._reply_memo) >= 1024:
                self._reply_memo.clear()
            ids = self.tokenizer.encode(text)
            tokens = self._reply_memo[text] = (ids, self.tokenizer.pieces(text, ids))
        return tokens

    @staticmethod
    def _tool_name(call: ScriptedToolCall, tools: list[dict[str, Any]] | None) -> str:
        wanted = [call.name] if isinstance(call.name, str) else call.name
        offered = [str((t.get("function") or t).get("name")) for t in tools or [] if isinstance(t, dict)]
        if isinstance(call.name, str) and (not tools or not call.offered_only):
            return call.name
        for name in wanted:
            if name in offered:
                return name
        raise ScriptError(f"scripted tool call wants one of {wanted} but the request offers {offered}")


class EventStream(Response):
    """An SSE answer written event by event (one HTTP chunk and one socket write each, as vLLM streams tokens),
    without StreamingResponse's per-stream task group that watches for a disconnect: the stand-in's stream is
    ready at once and written in one pass, and uvicorn drops what is sent after a client has left."""

    media_type = "text/event-stream"

    def __init__(self, events: Iterator[bytes]) -> None:
        self.events = events
        self.status_code = 200
        self.background = None
        self.init_headers(None)  # no body: no content-length, so uvicorn frames it chunked as vLLM's

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        event = next(self.events)
        for following in self.events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
            event = following
        # The last event and the end of the chunked body go out in one write.
        await send({"type": "http.response.body", "body": event, "more_body": False})


def create_app(engine: ScriptedEngine) -> ASGIApp:
    """The ASGI app: /v1/chat/completions, /v1/models, /health, /v1/load_lora_adapter, /v1/unload_lora_adapter,
    and PUT /scripted/script to set the script of an out-of-process engine."""
    app = FastAPI()

    def error(exc: VllmError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        now = int(time.time())
        entries: list[tuple[str, str | None, str]] = [(engine.model, None, "")]
        entries += [(name, engine.model, path) for name, path in engine.adapters.items()]
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": now,
                    "owned_by": "vllm",
                    "root": root or name,
                    "parent": parent,
                    "max_model_len": engine.max_model_len,
                }
                for name, parent, root in entries
            ],
        }

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: Request) -> Response:
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return error(
                VllmError(400, "Both 'lora_name' and 'lora_path' must be provided.", "BadRequestError")
            )
        if name in engine.adapters and not body.get("load_inplace"):
            return error(
                VllmError(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
            )
        if not Path(path).exists():
            return error(
                VllmError(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
            )
        engine.adapters[name] = path
        return Response(f"Success: LoRA adapter '{name}' added successfully.", media_type="text/plain")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: Request) -> Response:
        name = (await request.json()).get("lora_name")
        if name not in engine.adapters:
            return error(VllmError(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError"))
        del engine.adapters[name]
        return Response(f"Success: LoRA adapter '{name}' removed successfully.", media_type="text/plain")

    @app.put("/scripted/script")
    async def put_script(request: Request) -> dict[str, int]:
        script = Script.model_validate_json(await request.body())
        engine.set_script(script)
        return {"replies": len(script.replies)}

    # A plain Starlette route on the FastAPI app: FastAPI's per-request dependency solving and exit stacks are
    # not needed for a handler that takes the raw Request. `serve` below sends POSTs to it directly; the route
    # stays so that other methods get FastAPI's 405.
    async def chat(request: Request) -> Response:
        try:
            body = decode_json(await request.body())
            if not isinstance(body, dict):
                raise VllmError(400, "the request body must be a JSON object", "BadRequestError")
            completion = engine.complete(body)
        except json.JSONDecodeError as exc:
            return error(VllmError(400, f"invalid JSON: {exc}", "BadRequestError"))
        except VllmError as exc:
            return error(exc)
        except ScriptError as exc:
            return error(VllmError(400, f"scripted engine: {exc}", "BadRequestError"))
        if completion.delay_s:
            await asyncio.sleep(completion.delay_s)
        request_id, created = f"chatcmpl-{random_id()}", int(time.time())
        if not body.get("stream"):
            return Response(
                encode_json(chat_response(completion, body, request_id, created)),
                media_type="application/json",
            )
        return EventStream(sse_events(completion, body, request_id, created))

    app.add_route("/v1/chat/completions", chat, methods=["POST"])

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        """A chat call goes straight to its handler, the rest through FastAPI. The benchmark runs the stand-in on
        the cores of the proxy it measures; without FastAPI's router and its two middleware layers (each streamed
        event passed through both) a call cost 0.45-0.50 ms of CPU instead of 0.60 unstreamed, 0.95-1.13 instead
        of 1.15-1.18 streamed (one call at a time, 600 calls per figure, two interleaved pairs)."""
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/v1/chat/completions":
            response = await chat(Request(scope, receive))
            await response(scope, receive, send)
        else:
            await app(scope, receive, send)

    return serve


class ScriptedEngineServer:
    """Serves a ScriptedEngine with uvicorn on a background thread, on a free 127.0.0.1 port."""

    def __init__(self, engine: ScriptedEngine) -> None:
        import uvicorn

        self.engine = engine
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        config = uvicorn.Config(create_app(engine), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    def set_script(self, script: Script | list[ScriptedReply]) -> None:
        self.engine.set_script(script)

    def start(self, timeout_s: float = 10.0) -> ScriptedEngineServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("scripted engine did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)
        self._sock.close()


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(
        prog="scripted-engine", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--model", default="tiny", help="served model name")
    parser.add_argument("--tokenizer", default="fast", choices=["tiny", "bytes", "fast"])
    parser.add_argument("--model-dir", help="tiny model directory (tokenizer 'tiny')")
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--script", type=Path, help="JSON file holding a Script")
    parser.add_argument("--record-calls", action="store_true", help="keep the last 10,000 calls in memory")
    args = parser.parse_args(argv)
    engine = ScriptedEngine(
        make_tokenizer(args.tokenizer, args.model_dir),
        model=args.model,
        max_model_len=args.max_model_len,
        record_calls=args.record_calls,
    )
    if args.script:
        engine.set_script(Script.model_validate_json(args.script.read_text()))
    uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
