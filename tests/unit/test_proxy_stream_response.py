"""StreamAnswer, driven over ASGI by the test in the server's role: what one read of the engine rendered goes
out as one body message, the claims are released when the stream ends, and a disconnect stops the stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from harnessrl.runtime.proxy.asgi import Flusher, StreamAnswer, json_answer, read_body
from harnessrl.runtime.proxy.dialects.base import DialectError

SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "method": "POST", "path": "/"}


def _stream(events: list[list[bytes]], closed: list[str], gap: asyncio.Event | None = None) -> StreamAnswer:
    """A stream over `events`: each inner list is what one read of the engine's stream rendered."""
    flusher = Flusher()

    async def body() -> AsyncIterator[bytes]:
        for i, read in enumerate(events):
            await flusher.flush()  # what CapturedStream does before each read of the engine's stream
            if gap is not None and i == 1:
                await gap.wait()
            for piece in read:
                yield piece

    return StreamAnswer(body(), on_close=lambda: closed.append("closed"), flusher=flusher)


async def test_what_one_read_rendered_goes_out_as_one_message() -> None:
    sent: list[dict[str, Any]] = []
    closed: list[str] = []

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(3600)  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    stream = _stream([[b"a", b"b", b"c"], [b"d", b"e"]], closed)
    await asyncio.wait_for(stream.send(send, receive), timeout=5)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body", "http.response.body"]
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [(b"abc", True), (b"de", False)]
    assert closed == ["closed"]


async def test_a_disconnect_mid_stream_stops_it_and_releases_the_call() -> None:
    sent: list[dict[str, Any]] = []
    closed: list[str] = []
    first_sent, never = asyncio.Event(), asyncio.Event()  # the engine's second read never comes

    async def receive() -> dict[str, Any]:
        await first_sent.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            first_sent.set()

    stream = _stream([[b"a"], [b"b"]], closed, gap=never)
    await asyncio.wait_for(stream.send(send, receive), timeout=5)
    assert [m.get("body") for m in sent] == [None, b"a"]
    assert closed == ["closed"]


async def test_a_whole_answer_is_two_messages_with_its_length() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        raise AssertionError("a whole answer does not wait for the client")

    await json_answer({"error": "x"}, 429, {"Retry-After": "2"}).send(send, receive)
    assert sent[0]["status"] == 429
    assert sent[0]["headers"] == [(b"content-type", b"application/json"), (b"retry-after", b"2"),
                                  (b"content-length", b"13")]
    assert sent[1] == {"type": "http.response.body", "body": b'{"error":"x"}'}


async def test_a_body_is_read_whole_and_refused_past_the_limit() -> None:
    def receiver(*chunks: bytes) -> Any:
        messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

        async def receive() -> dict[str, Any]:
            return messages.pop(0)

        return receive

    scope: dict[str, Any] = {"headers": []}
    assert await read_body(scope, receiver(b"abc"), 10) == b"abc"
    assert await read_body(scope, receiver(b"ab", b"cd", b""), 10) == b"abcd"
    with pytest.raises(DialectError, match="over the limit of 10 bytes") as refused:
        await read_body(scope, receiver(b"abcdef", b"ghijkl"), 10)
    assert refused.value.kind == "too_large"
    with pytest.raises(DialectError, match="over the limit of 10 bytes"):
        await read_body(scope, receiver(b"abcdefghijkl"), 10)  # one message, no declared length
    declared = {"headers": [(b"content-length", b"11")]}
    with pytest.raises(DialectError, match="of 11 bytes is over the limit of 10 bytes"):
        await read_body(declared, receiver(b""), 10)  # refused before anything is read
