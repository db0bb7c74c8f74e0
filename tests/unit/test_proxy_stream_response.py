"""CoalescingStream, driven over ASGI by the test in the server's role: what one read of the engine rendered goes
out as one body message, the claims are released when the stream ends, and a disconnect stops the stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from harnessrl.runtime.proxy.app import CoalescingStream, Flusher

SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "method": "POST", "path": "/"}


def _stream(events: list[list[bytes]], closed: list[str], gap: asyncio.Event | None = None) -> CoalescingStream:
    """A stream over `events`: each inner list is what one read of the engine's stream rendered."""
    flusher = Flusher()

    async def body() -> AsyncIterator[bytes]:
        for i, read in enumerate(events):
            await flusher.flush()  # what CapturedStream does before each read of the engine's stream
            if gap is not None and i == 1:
                await gap.wait()
            for piece in read:
                yield piece

    return CoalescingStream(flusher, body(), on_close=lambda: closed.append("closed"), media_type="text/event-stream")


async def test_what_one_read_rendered_goes_out_as_one_message() -> None:
    sent: list[dict[str, Any]] = []
    closed: list[str] = []

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(3600)  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    stream = _stream([[b"a", b"b", b"c"], [b"d", b"e"]], closed)
    await asyncio.wait_for(stream(SCOPE, receive, send), timeout=5)
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
    await asyncio.wait_for(stream(SCOPE, receive, send), timeout=5)
    assert [m.get("body") for m in sent] == [None, b"a"]
    assert closed == ["closed"]
