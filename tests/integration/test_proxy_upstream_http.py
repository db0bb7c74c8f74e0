"""The proxy's upstream HTTP/1.1 client (runtime/proxy/upstream_http.py) against real servers on loopback.

The engine side is the scripted vLLM stand-in (uvicorn, as vLLM itself) for ordinary answers; the failure cases
(a connection closed under a request, a server that never answers, an answer that is not HTTP, `Connection:
close`) use a tiny asyncio server written here, because uvicorn cannot be made to misbehave on cue."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from harnessrl.runtime.proxy.upstream_http import (
    Limits,
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamPool,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from tests.fakes import scripted_engine as scripted

    server = scripted.ScriptedEngineServer(scripted.ScriptedEngine(scripted.make_tokenizer("bytes"))).start()
    server.set_script([scripted.ScriptedReply(content="Done.")])
    yield server
    server.stop()


def _chat(stream: bool) -> bytes:
    return json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": stream}).encode()


async def _post(pool: UpstreamPool, url: str, stream: bool) -> tuple[int, bytes]:
    response = await pool.request("POST", f"{url}/v1/chat/completions", _chat(stream),
                                  {"content-type": "application/json"})
    try:
        return response.status, await response.read()
    finally:
        response.release()


async def test_answers_json_and_sse_over_one_kept_alive_connection(engine: Any) -> None:
    pool = UpstreamPool(Limits())
    try:
        answers = [await _post(pool, engine.root_url, stream) for stream in (False, True, False, True)]
        assert [status for status, _ in answers] == [200] * 4
        assert json.loads(answers[0][1])["choices"][0]["message"]["content"] == "Done."
        events = [line for line in answers[1][1].split(b"\n") if line.startswith(b"data: ")]
        assert events[-1] == b"data: [DONE]" and len(events) > 3  # chunked transfer, read to its end
        (origin,) = pool._origins.values()
        assert len(origin.open) == 1  # every call reused the first connection
        assert len(origin.idle) == 1
    finally:
        await pool.close()


async def test_concurrent_calls_stay_within_the_connection_limit(engine: Any) -> None:
    pool = UpstreamPool(Limits(max_connections=3))
    try:
        answers = await asyncio.gather(*(_post(pool, engine.root_url, i % 2 == 0) for i in range(12)))
        assert [status for status, _ in answers] == [200] * 12
        (origin,) = pool._origins.values()
        assert 1 <= len(origin.open) <= 3
    finally:
        await pool.close()


async def test_an_engine_that_refuses_connections_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    pool = UpstreamPool(Limits())
    with pytest.raises(UpstreamConnectError, match=f"127.0.0.1:{port}"):
        await _post(pool, f"http://127.0.0.1:{port}", False)
    assert pool._open == 0  # the failed attempt gave its slot back


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    await reader.readexactly(length)


async def test_a_connection_closed_under_a_request_is_broken_and_a_slow_engine_times_out() -> None:
    async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.close()

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)
        writer.close()

    async def not_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()

    pool = UpstreamPool(Limits(read_timeout_s=0.3))
    servers = []
    try:
        for handler, error in ((close_at_once, UpstreamBroken), (never_answer, TimeoutError),
                               (not_http, UpstreamBroken)):
            server, url = await _serve(handler)
            servers.append(server)
            with pytest.raises(error):
                await _post(pool, url, False)
        assert pool._open == 0  # every broken connection was closed and its slot given back
    finally:
        await pool.close()
        for server in servers:
            server.close()


async def test_an_answer_with_connection_close_is_not_reused() -> None:
    connections = 0

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server, url = await _serve(once)
    pool = UpstreamPool(Limits())
    try:
        assert [await _post(pool, url, False) for _ in range(3)] == [(200, b"ok")] * 3
        assert connections == 3
    finally:
        await pool.close()
        server.close()
