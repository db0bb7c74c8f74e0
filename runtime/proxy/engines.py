"""Upstream to vLLM: the request the engine gets, the pooled HTTP client, and routing across engine replicas.

One `httpx.AsyncClient` (HTTP/1.1, keep-alive, limits from config) serves every call. A session sticks to one
engine (rendezvous hashing over the healthy, non-draining engines) so its growing prefix stays in that engine's
prefix cache; an engine that refuses connections is skipped for `unhealthy_for_s` and the call moves on.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from harnessrl.runtime.proxy.config import UpstreamLimits
from harnessrl.runtime.proxy.dialects.base import CanonicalRequest, DialectError
from harnessrl.runtime.proxy.dialects.upstream import Completion, CompletionChunk

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
    request: CanonicalRequest, model: str, *, training: bool, stream: bool, max_tokens_cap: int | None = None
) -> dict[str, Any]:
    """The JSON body sent to vLLM for one call. Pure.

    Training sessions also sample at temperature 1: vLLM reports logprobs of the raw model distribution, so any
    other temperature would make the recorded behaviour logprobs differ from the distribution sampled from.
    A harness that asks for no limit (Mini-SWE-Agent) would otherwise generate to the context length.
    """
    body = request.upstream_body()
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
        body["temperature"] = 1.0
    if stream:
        body["stream_options"] = {"include_usage": True}
    else:
        body.pop("stream_options", None)
    return body


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

    def mark_down(self, engine: Engine) -> None:
        engine.failures += 1
        engine.unhealthy_until = time.monotonic() + self.unhealthy_for_s


def make_client(limits: UpstreamLimits) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        http1=True,
        http2=False,
        limits=httpx.Limits(
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry_s,
        ),
        timeout=httpx.Timeout(
            connect=limits.connect_timeout_s,
            read=limits.read_timeout_s,
            write=limits.read_timeout_s,
            pool=limits.pool_timeout_s,
        ),
    )


class EngineClient:
    """Calls one engine. Connection failures raise `httpx.TransportError` (the caller may move to another engine
    only before anything was sent to the harness); engine error answers raise via `classify_upstream_error`."""

    def __init__(self, client: httpx.AsyncClient, retry_after_s: float) -> None:
        self._client = client
        self._retry_after_s = retry_after_s

    async def complete(self, engine: Engine, body: dict[str, Any]) -> Completion:
        response = await self._client.post(f"{engine.url}/v1/chat/completions", json=body)
        if response.status_code != 200:
            raise classify_upstream_error(response.status_code, response.content, self._retry_after_s)
        try:
            return Completion.model_validate_json(response.content)
        except ValueError as exc:
            raise DialectError(f"engine answered with an unreadable completion: {exc}", "upstream") from None

    async def open_stream(self, engine: Engine, body: dict[str, Any]) -> httpx.Response:
        """Send a streaming call; the response is open (status checked) and must be closed by the caller."""
        request = self._client.build_request("POST", f"{engine.url}/v1/chat/completions", json=body)
        response = await self._client.send(request, stream=True)
        if response.status_code != 200:
            raw = await response.aread()
            await response.aclose()
            raise classify_upstream_error(response.status_code, raw, self._retry_after_s)
        return response

    @staticmethod
    async def chunks(response: httpx.Response) -> AsyncIterator[CompletionChunk]:
        """Parse vLLM's SSE stream (`data: {...}` lines, `data: [DONE]`)."""
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                # Read on to the end of the body rather than return: a fully read response lets the pool reuse
                # the connection, an abandoned one is closed.
                continue
            try:
                yield CompletionChunk.model_validate_json(data)
            except ValueError as exc:
                raise DialectError(f"engine sent an unreadable stream chunk: {exc}", "upstream") from None

    async def count_tokens(self, engine: Engine, request: CanonicalRequest, model: str) -> int:
        """Prompt length as the engine templates it (vLLM's /tokenize with chat messages and tools)."""
        body: dict[str, Any] = {"model": model, "messages": request.upstream_body()["messages"]}
        if request.tools:
            body["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in request.tools]
        response = await self._client.post(f"{engine.url}/tokenize", json=body)
        if response.status_code != 200:
            raise classify_upstream_error(response.status_code, response.content, self._retry_after_s)
        return int(response.json()["count"])

    async def healthy(self, engine: Engine) -> bool:
        try:
            response = await self._client.get(f"{engine.url}/health", timeout=2.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200
