"""Upstream to vLLM: the request the engine gets, the pooled HTTP client, and routing across engine replicas.

One `UpstreamPool` (HTTP/1.1, keep-alive, limits from config; upstream_http.py) serves every call. A session sticks to one
engine (rendezvous hashing over the healthy, non-draining engines) so its growing prefix stays in that engine's
prefix cache; an engine that refuses connections is skipped for `unhealthy_for_s` and the call moves on.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from harnessrl.runtime.contracts.proxy_config import UpstreamLimits
from harnessrl.runtime.proxy.dialects.base import CanonicalRequest, DialectError, EncodedMessages
from harnessrl.runtime.proxy.dialects.shared_tools import tools_json
from harnessrl.runtime.proxy.dialects.upstream import STREAM_CHUNK, Completion, CompletionChunk
from harnessrl.runtime.proxy.upstream_http import Limits, UpstreamPool, UpstreamResponse
from pydantic_core import to_json

# Sampling knobs reset so samples (and their logprobs) come from the full policy distribution.
_NEUTRAL_SAMPLING: dict[str, Any] = {
    "top_p": 1.0,
    "top_k": 0,  # vLLM 0.32: 0 disables top-k (-1 is still accepted)
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
}

_CONTEXT_MARKERS = ("maximum context length", "max_model_len", "context length")


class ContextLengthExceeded(Exception):
    """vLLM refused the prompt (or prompt + max_tokens) as longer than the model's context."""


def upstream_body(
    request: CanonicalRequest, model: str, *, training: bool, stream: bool, max_tokens_cap: int | None = None,
    temperature: float = 1.0, seed: int | None = None,
) -> dict[str, Any]:
    """The JSON body sent to vLLM for one call. Pure.

    Training sessions sample at the run's `temperature` whatever the harness asked for: the learner scores the
    tokens at that temperature (vLLM reports the logprobs of the distribution it sampled from), so the recorded
    behaviour logprobs and the learner's agree. Evaluation keeps the harness's own sampling.
    A harness that asks for no limit (Mini-SWE-Agent) would otherwise generate to the context length.
    `seed` (a seeded run's `seeding.call_seed`) replaces a training call's own seed; an evaluation call keeps the
    harness's seed where it sent one.
    """
    body = request.upstream_body()
    _add_proxy_fields(body, model, training=training, stream=stream, max_tokens_cap=max_tokens_cap,
                      temperature=temperature, seed=seed)
    return body


def upstream_json(
    request: CanonicalRequest, model: str, messages: EncodedMessages, *, training: bool, stream: bool,
    max_tokens_cap: int | None = None, temperature: float = 1.0, seed: int | None = None,
) -> bytes:
    """`upstream_body` as the JSON bytes sent, its messages encoded through the session's `messages` memo."""
    head = request.model_dump(mode="json", exclude_none=True, exclude={"messages", "tools"})
    _add_proxy_fields(head, model, training=training, stream=stream, max_tokens_cap=max_tokens_cap,
                      temperature=temperature, seed=seed)
    tools = (b'"tools":', tools_json(request.tools), b",") if request.tools is not None else ()
    return b"".join((b'{"messages":[', messages.encode(request.messages), b"],", *tools, memoryview(to_json(head))[1:]))


def _add_proxy_fields(
    body: dict[str, Any], model: str, *, training: bool, stream: bool, max_tokens_cap: int | None, temperature: float,
    seed: int | None,
) -> None:
    if max_tokens_cap is not None:
        asked = body.get("max_tokens")
        body["max_tokens"] = max_tokens_cap if asked is None else min(int(asked), max_tokens_cap)
    body.update(_NEUTRAL_SAMPLING)
    body["model"] = model
    body["logprobs"] = True
    body["top_logprobs"] = 0
    body["return_token_ids"] = True
    body["stream"] = stream
    if training:
        body["temperature"] = temperature
    if seed is not None:
        body["seed"] = seed if training else body.get("seed", seed)
    if stream:
        body["stream_options"] = {"include_usage": True}
    else:
        body.pop("stream_options", None)


def is_context_error(message: str) -> bool:
    lowered = message.lower()
    return any(marker in lowered for marker in _CONTEXT_MARKERS)


def _error_message(status: int, raw: bytes) -> str:
    try:
        data = json.loads(raw)
    except ValueError:
        return raw[:500].decode("utf-8", "replace") or f"HTTP {status}"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(data.get("message"), str):
            return str(data["message"])
    return raw[:500].decode("utf-8", "replace")


def classify_upstream_error(status: int, raw: bytes, retry_after_s: float) -> Exception:
    """vLLM's error answer as the exception the proxy acts on: context length, a 4xx passed on, or a 5xx."""
    message = _error_message(status, raw)
    if status == 400 and is_context_error(message):
        return ContextLengthExceeded(message)
    if status in (429, 503):
        return DialectError(f"engine busy: {message}", "overloaded", retry_after=retry_after_s)
    if status == 404:
        # The proxy always names the current policy: an engine that does not know it has just restarted and not
        # yet had the policy's adapter loaded again. The harness retries later.
        return DialectError(f"engine not serving the policy yet: {message}", "overloaded", retry_after=retry_after_s)
    if 400 <= status < 500:
        return DialectError(f"engine refused the request: {message}", "invalid_request")
    return DialectError(f"engine error (HTTP {status}): {message}", "upstream")


@dataclass
class Engine:
    url: str
    draining: bool = False
    unhealthy_until: float = 0.0
    inflight: int = 0
    calls: int = 0
    failures: int = 0
    # Token splicing (splicing.py): False once the engine showed it does not serve the render endpoints; the
    # token its chat template closes an assistant turn with, once asked.
    renders: bool = True
    end_token: int | None = None

    def available(self, now: float) -> bool:
        return not self.draining and now >= self.unhealthy_until


@dataclass
class EnginePool:
    """The engine replicas and which one serves a session. Pure bookkeeping, no I/O."""

    engines: list[Engine]
    unhealthy_for_s: float = 5.0
    _by_url: dict[str, Engine] = field(init=False)

    def __post_init__(self) -> None:
        self._by_url = {e.url: e for e in self.engines}

    @classmethod
    def from_urls(cls, urls: list[str]) -> EnginePool:
        return cls([Engine(u.rstrip("/")) for u in urls])

    def get(self, url: str) -> Engine | None:
        return self._by_url.get(url.rstrip("/"))

    def pick(self, affinity: str, exclude: frozenset[str] = frozenset()) -> Engine | None:
        """The engine for this session key: highest rendezvous score among the available ones.

        Rendezvous hashing keeps a session on one engine while that engine stays available and moves only the
        sessions of an engine that leaves; with none available (all draining or down) the call gets None."""
        now = time.monotonic()
        candidates = [e for e in self.engines if e.available(now) and e.url not in exclude]
        if not candidates:
            return None
        return max(candidates, key=lambda e: hashlib.blake2b(f"{affinity}|{e.url}".encode(), digest_size=8).digest())

    def renders(self) -> bool:
        """Whether an engine may serve the render endpoints splicing needs (none has shown it does not)."""
        return any(e.renders for e in self.engines)

    def mark_down(self, engine: Engine) -> None:
        engine.failures += 1
        engine.unhealthy_until = time.monotonic() + self.unhealthy_for_s


def make_client(limits: UpstreamLimits) -> UpstreamPool:
    """The one upstream client (not httpx: httpcore's pool scans every connection on each request and release,
    encode/httpcore#1035, a third of the proxy's CPU at a few hundred sessions; not aiohttp: its per-request
    machinery cost ~0.3 ms per call, `benchmarks/proxy/floor.py`)."""
    return UpstreamPool(Limits(
        max_connections=limits.max_connections,
        keepalive_expiry_s=limits.keepalive_expiry_s,
        connect_timeout_s=limits.connect_timeout_s,
        read_timeout_s=limits.read_timeout_s,
        pool_timeout_s=limits.pool_timeout_s,
    ))


_JSON_HEADERS = {"content-type": "application/json"}


class EngineClient:
    """Calls one engine. Transport failures raise `UpstreamError` (`UpstreamConnectError`: the engine cannot be
    reached; the caller may move to another engine only before anything was sent to the harness); silence past a
    timeout raises `TimeoutError`; engine error answers raise via `classify_upstream_error`."""

    def __init__(self, client: UpstreamPool, retry_after_s: float, auth: dict[str, str] | None = None) -> None:
        self._client = client
        self._retry_after_s = retry_after_s
        self._headers = _JSON_HEADERS | (auth or {})  # auth: the engines' API key, where they require one

    async def _post(self, url: str, body: bytes) -> UpstreamResponse:
        """POST a JSON body; the response is open (status checked) and must be released by the caller."""
        response = await self._client.request("POST", url, body, self._headers)
        if response.status != 200:
            try:
                raw = await response.read()
            finally:
                response.release()
            raise classify_upstream_error(response.status, raw, self._retry_after_s)
        return response

    async def _post_read(self, url: str, body: bytes) -> bytes:
        response = await self._post(url, body)
        try:
            return await response.read()
        finally:
            response.release()

    async def complete(
        self, engine: Engine, body: bytes, parse: Callable[[bytes], Completion] = Completion.model_validate_json,
        path: str = "/v1/chat/completions",
    ) -> Completion:
        """`parse` reads the answer's JSON (the proxy's reads the prompt ids knowing the session's prefix)."""
        raw = await self._post_read(f"{engine.url}{path}", body)
        try:
            return parse(raw)
        except ValueError as exc:
            raise DialectError(f"engine answered with an unreadable completion: {exc}", "upstream") from None

    async def open_stream(self, engine: Engine, body: bytes) -> UpstreamResponse:
        """Send a streaming call; the response is open (status checked) and must be released by the caller."""
        return await self._post(f"{engine.url}/v1/chat/completions", body)

    @staticmethod
    async def chunks(
        response: UpstreamResponse,
        before_read: Callable[[], Awaitable[None]] | None = None,
        parse: Callable[[bytes], CompletionChunk] = STREAM_CHUNK.validator.validate_json,
    ) -> AsyncIterator[CompletionChunk]:
        """Parse vLLM's SSE stream (`data: {...}` events, `data: [DONE]`), read to the end of the body so the
        connection goes back to the pool. `before_read` is awaited each time
        every chunk read so far has been consumed and the next read from the socket is due; `parse` reads one
        event's JSON (the proxy's reads the prompt ids knowing the session's prefix)."""
        partial: list[bytes] = []  # the pieces of a line not yet ended, so each read is split once
        while True:
            if before_read is not None:
                await before_read()
            data = await response.readany()
            if not data:
                break
            *lines, rest = data.split(b"\n")
            if lines and partial:
                lines[0] = b"".join((*partial, lines[0]))
                partial.clear()
            if rest:
                partial.append(rest)
            for line in lines:
                if not line:  # the blank line after each event
                    continue
                chunk = _sse_chunk(line, parse)
                if chunk is not None:
                    yield chunk
        chunk = _sse_chunk(b"".join(partial), parse)
        if chunk is not None:
            yield chunk

    async def render(self, engine: Engine, body: bytes) -> dict[str, Any] | None:
        """vLLM's rendering of a Chat Completions body: the request `/inference/v1/generate` takes (its
        `token_ids`: the templated prompt). None when the engine does not serve it (started without
        `--enable-scale-out`, or not vLLM); it is then not asked again."""
        response = await self._client.request("POST", f"{engine.url}/v1/chat/completions/render", body,
                                              self._headers)
        try:
            raw = await response.read()
        finally:
            response.release()
        if response.status in (403, 404, 405):
            engine.renders = False
            return None
        if response.status != 200:
            raise classify_upstream_error(response.status, raw, self._retry_after_s)
        rendered: dict[str, Any] = json.loads(raw)
        return rendered

    async def generate(self, engine: Engine, request: dict[str, Any]) -> dict[str, Any]:
        """Token in, token out: vLLM's `/inference/v1/generate` on a rendered (and spliced) request."""
        generated: dict[str, Any] = json.loads(await self._post_read(f"{engine.url}/inference/v1/generate",
                                                                     to_json(request)))
        return generated

    async def derender(self, engine: Engine, body: dict[str, Any]) -> Completion:
        """A generate answer as the Chat Completion the chat endpoint would have made of it (text, reasoning and
        tool calls parsed by the engine's own parsers)."""
        return await self.complete(engine, to_json(body), path="/v1/chat/completions/derender")

    async def count_tokens(self, engine: Engine, request: CanonicalRequest, model: str) -> int:
        """Prompt length as the engine templates it (vLLM's /tokenize with chat messages and tools)."""
        body: dict[str, Any] = {"model": model, "messages": request.upstream_body()["messages"]}
        if request.tools:
            body["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in request.tools]
        raw = await self._post_read(f"{engine.url}/tokenize", to_json(body))
        return int(json.loads(raw)["count"])



def _sse_chunk(line: bytes, parse: Callable[[bytes], CompletionChunk]) -> CompletionChunk | None:
    """One SSE line as a chunk; None for blank lines, comments, other fields and the `[DONE]` marker."""
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if data == b"[DONE]":
        return None
    try:
        return parse(data)
    except ValueError as exc:
        raise DialectError(f"engine sent an unreadable stream chunk: {exc}", "upstream") from None
