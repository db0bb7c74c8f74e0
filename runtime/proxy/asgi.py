"""Plain ASGI for the proxy's hot path: reading a call's body and sending an answer, whole or streamed.

Dialect calls are served by a bare ASGI function, not a FastAPI route: at hundreds of calls a second the
framework's layers (middleware wrapping every `send`, routing, Request/Response objects, the anyio task group of a
streaming response) cost more CPU than the call's own work. The admin API stays a FastAPI app.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from harnessrl.runtime.proxy.dialects.base import DialectError
from pydantic_core import to_json
from starlette.types import Message, Receive, Scope, Send

JSON_TYPE = b"application/json"
SSE_HEADERS = ((b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"))


def header(scope: Scope, name: bytes) -> str | None:
    """A request header (the last one of that name), or None; `name` in lower case as ASGI gives them."""
    found = None
    for key, value in scope["headers"]:
        if key == name:
            found = value
    return None if found is None else found.decode("latin-1")


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body; one over `limit` bytes is refused (in the caller's dialect) as soon as that is known."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise DialectError(f"request body of {declared} bytes is over the limit of {limit} bytes", "too_large")
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise DialectError(f"request body is over the limit of {limit} bytes", "too_large")
        chunks.append(chunk)
        more = message.get("more_body", False)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _headers(content_type: bytes, extra: dict[str, str] | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", content_type)]
    headers.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (extra or {}).items())
    return headers


@dataclass
class Answer:
    """A whole answer: one start message, one body message."""

    body: bytes
    status: int = 200
    headers: dict[str, str] | None = None
    content_type: bytes = JSON_TYPE

    async def send(self, send: Send, receive: Receive) -> None:
        headers = _headers(self.content_type, self.headers)
        headers.append((b"content-length", str(len(self.body)).encode()))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


def json_answer(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Answer:
    """Encoded by pydantic-core, ~4x faster than the standard library's encoder."""
    return Answer(to_json(content), status, headers)


class Flusher:
    """Holds a stream's rendered events until `flush` sends them as one body message."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.send: Send | None = None

    async def flush(self, more_body: bool = True) -> None:
        if self.send is None or (more_body and not self.pieces):
            return
        body = b"".join(self.pieces)
        self.pieces.clear()
        await self.send({"type": "http.response.body", "body": body, "more_body": more_body})


@dataclass
class StreamAnswer:
    """An SSE answer that sends, in one message, all the events rendered from one read of the engine's stream.

    Under load one read carries many of vLLM's per-token chunks, and each send costs far more than its bytes;
    with an engine that is not ahead of the proxy, every read still goes out at once. `on_close` runs however
    the stream ends, also when the client left before the body generator ever ran."""

    events: AsyncIterator[bytes | str]
    on_close: Callable[[], None] = lambda: None
    flusher: Flusher = field(default_factory=Flusher)
    headers: Iterable[tuple[bytes, bytes]] = SSE_HEADERS

    async def send(self, send: Send, receive: Receive) -> None:
        """Stream, and stop when the client disconnects (it arrives through `receive`, ASGI spec 2.3; a `send`
        after it is a no-op), with one plain watcher task: Starlette's anyio task group for the same cost
        ~0.18 ms of CPU per stream here, more than a short stream's own work."""
        streaming = asyncio.ensure_future(self._stream(send))
        watcher = asyncio.ensure_future(_until_disconnect(receive))
        watcher.add_done_callback(lambda _: streaming.cancel())
        try:
            await streaming
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # cancelled from outside, not by the watcher
                raise
        finally:
            watcher.cancel()
            self.on_close()

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": list(self.headers)})
        self.flusher.send = send
        async for piece in self.events:
            self.flusher.pieces.append(piece.encode() if isinstance(piece, str) else piece)
        await self.flusher.flush(more_body=False)


async def _until_disconnect(receive: Receive) -> None:
    message: Message = await receive()
    while message["type"] != "http.disconnect":
        message = await receive()
