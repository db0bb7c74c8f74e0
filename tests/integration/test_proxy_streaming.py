"""The proxy forwards a stream as the engine produces it: its writes are coalesced per read of the engine's stream,
never held until the end.

The engine here is a small slow SSE server on loopback that speaks vLLM 0.32's chunk shape (token ids, logprobs,
usage chunk, `[DONE]`) and pauses mid-stream, which the scripted engine stand-in cannot do."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.fixtures.proxy_server import ProxyFactory
from tests.integration.proxy_helpers import BY_NAME, create_session

pytestmark = pytest.mark.timeout(60)

PAUSE_S = 1.5


def _chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "tiny",
            "choices": choices, **extra}
    return f"data: {json.dumps(body)}\n\n".encode()


def _token(text: str, token_id: int, finish: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": {"content": text}, "finish_reason": finish, "token_ids": [token_id],
            "logprobs": {"content": [{"token": text, "logprob": -0.25, "bytes": list(text.encode()),
                                      "top_logprobs": []}]}}


async def _slow_stream() -> AsyncIterator[bytes]:
    yield _chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                 prompt_token_ids=[1, 2, 3])
    yield _chunk([_token("Hello", 7)])
    await asyncio.sleep(PAUSE_S)
    yield _chunk([_token(" world", 8, finish="stop")])
    yield _chunk([], usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
    yield b"data: [DONE]\n\n"


@pytest.fixture(scope="module")
def slow_sse_engine() -> Iterator[str]:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def chat(_: Request) -> StreamingResponse:
        return StreamingResponse(_slow_stream(), media_type="text/event-stream")

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]),
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "slow SSE engine did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)
    sock.close()


def test_a_stream_reaches_the_harness_before_the_engine_finishes(proxy_factory: ProxyFactory,
                                                                  slow_sse_engine: str) -> None:
    proxy = proxy_factory([slow_sse_engine])
    sid = str(create_session(proxy.url, proxy.admin_headers)["session_id"])
    chat = BY_NAME["openai_chat"]
    arrivals: list[tuple[float, str]] = []
    began = time.monotonic()
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json=chat.body("hi", stream=True),
                      headers=chat.headers(sid), timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                for choice in json.loads(line[5:])["choices"]:
                    if choice["delta"].get("content"):
                        arrivals.append((time.monotonic() - began, choice["delta"]["content"]))
    assert [text for _, text in arrivals] == ["Hello", " world"]
    first, last = arrivals[0][0], arrivals[-1][0]
    assert first < PAUSE_S - 0.3 < last  # "Hello" went out while the engine was still pausing
    turns = httpx.get(f"{proxy.url}/sessions/{sid}/turns", headers=proxy.admin_headers, timeout=10).json()
    assert turns[0]["turn"]["completion_ids"] == [7, 8] and turns[0]["turn"]["logprobs"] == [-0.25, -0.25]


def test_a_harness_that_leaves_mid_stream_frees_the_call_at_once(proxy_factory: ProxyFactory,
                                                                 slow_sse_engine: str) -> None:
    """The harness hangs up while the engine pauses mid-stream: the proxy stops the call then (its in-flight
    slot is free long before the engine would have finished), and records no answered turn."""
    proxy = proxy_factory([slow_sse_engine])
    sid = str(create_session(proxy.url, proxy.admin_headers)["session_id"])
    chat = BY_NAME["openai_chat"]
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json=chat.body("hi", stream=True),
                      headers=chat.headers(sid), timeout=30) as response:
        for line in response.iter_lines():
            if "Hello" in line:
                break
    left = time.monotonic()
    while httpx.get(f"{proxy.url}/healthz", timeout=5).json()["inflight"]:
        assert time.monotonic() - left < PAUSE_S - 0.5, "the call stayed in flight after the harness left"
        time.sleep(0.02)
    info = httpx.get(f"{proxy.url}/sessions/{sid}", headers=proxy.admin_headers, timeout=5).json()
    assert info["calls"] == 0 and info["turns"] == 0
