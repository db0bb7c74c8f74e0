"""How every harnessrl HTTP server is built (the proxy, the coordinators, the runner's and the operator's metrics,
the adapter store): uvicorn on httptools, with a request's head and body bounded in size and in time, and the
program's own logging.

uvicorn bounds neither on httptools (h11 has `h11_max_incomplete_event_size`; neither has a deadline on reading
a request's head: `timeout_keep_alive` runs only between requests). Issue #47 measured on the proxy before these limits:
four connections sending 128 MB of unfinished headers took it from 87 to 818 MB, never given back, and 200
connections sending a header byte now and then were all held for as long as they liked. So a request's head (its
request line and headers) must arrive within `max_head_bytes` (else 431 and the connection closes) and within
`head_timeout_s` of its first byte, or of the connection's start (else 408, or a plain close when nothing came).
Its body, likewise, must be whole within `body_timeout_s` of its head (a body trickled a byte at a time held a
connection and its request's task for as long as the caller liked: 408) and at most `max_body_bytes`, declared or
sent (413), whether or not the app reads it. Between requests a kept-alive connection waits `keep_alive_s`, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

from harnessrl.runtime.contracts.server_limits import ServerLimits

if TYPE_CHECKING:
    import uvicorn

# ASGI's callables (as starlette.types names them), spelled out so that no image needs starlette for a type.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _status(code: int, reason: str) -> bytes:
    body = reason.encode()
    return (f"HTTP/1.1 {code} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


def http_protocol(limits: ServerLimits) -> type[asyncio.Protocol]:
    """The protocol class uvicorn builds each connection with: its httptools protocol with a size limit and a
    deadline on each request's head and on its body (`limits`). uvicorn is imported here, not with this module:
    configs import `ServerLimits`, and the proxy reads its config before it re-executes itself on mimalloc."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_bytes = 0
            self._body_bytes = 0
            self._in_head = True  # False from a request's headers to its end (its body)
            self._refused = False  # answered by these limits: the parser's remaining callbacks are ignored
            self._head_timer: asyncio.TimerHandle | None = None
            self._body_timer: asyncio.TimerHandle | None = None
            self._arm_head_timer()

        def _arm_head_timer(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(limits.head_timeout_s, self._head_timed_out)

        def _disarm_timers(self) -> None:
            for timer in (self._head_timer, self._body_timer):
                if timer is not None:
                    timer.cancel()
            self._head_timer = self._body_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.cycle is not None and not self.cycle.response_complete:
                # A pipelined head arriving while an answer streams: its time counts from when that answer ends.
                self._arm_head_timer()
                return
            self._refuse(_status(408, "Request Timeout") if self._head_bytes else b"")

        def _body_timed_out(self) -> None:
            self._body_timer = None
            if self.pipeline:  # a pipelined request, unread until the answer before it ends: its time starts then
                self._body_timer = self.loop.call_later(limits.body_timeout_s, self._body_timed_out)
                return
            self._refuse(_status(408, "Request Timeout"), self.cycle)

        def _refuse(self, answer: bytes, request: RequestResponseCycle | None = None) -> None:
            """Answer `answer` and close. `request`: the one refused, when its app runs already: it reads a
            disconnect and what it sends afterwards is dropped; if it had begun answering, it is not answered."""
            self._refused = True
            self._disarm_timers()
            if request is not None:
                if request.response_started:
                    answer = b""
                request.disconnected = True
                request.message_event.set()
            if not self.transport.is_closing():
                if answer:
                    self.transport.write(answer)
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            counted = self._in_head
            if counted:
                self._head_bytes += len(data)
            super().data_received(data)
            # Checked after parsing: bytes past a head that ended in this chunk are its body, not head. Unparsed,
            # the parser holds at most the limit plus one read (256 KiB).
            if counted and self._in_head and self._head_bytes > limits.max_head_bytes and not self._refused:
                self._refuse(_status(431, "Request Header Fields Too Large"))

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm_head_timer()

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._head_bytes = self._body_bytes = 0
            self._disarm_timers()
            declared = dict(self.headers).get(b"content-length", b"0")
            if not declared.isdigit() or int(declared) > limits.max_body_bytes:
                # Refused before the app runs: nothing of the body is read.
                self._refuse(_status(413, "Content Too Large"))
                return
            self._body_timer = self.loop.call_later(limits.body_timeout_s, self._body_timed_out)
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if self._refused:
                return
            self._body_bytes += len(body)
            if self._body_bytes > limits.max_body_bytes:  # a chunked body: no length declared up front
                self._refuse(_status(413, "Content Too Large"), self.cycle)
                return
            super().on_body(body)

        def on_message_complete(self) -> None:
            if self._refused:
                return
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None
            super().on_message_complete()
            self._in_head = True

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_timers()
            super().connection_lost(exc)

    return BoundedHttpToolsProtocol


def server(app: ASGIApp, host: str, port: int, limits: ServerLimits | None = None, log_level: str = "warning",
           takes_signals: bool = True, **options: Any) -> uvicorn.Server:
    """A uvicorn server for `app` with `limits` on every connection. It logs through the program's logging
    (runtime/logs.py: its redaction of bearer values included), never uvicorn's own handlers; no access log (one
    line per call, with the call's path, is neither affordable nor safe); no WebSocket upgrades (no server here speaks
    it, and an upgraded connection would escape these limits). `takes_signals=False`: its `serve()` leaves SIGTERM
    and SIGINT to the program whose loop it shares (kopf's). `options`: other uvicorn settings."""
    import uvicorn

    limits = limits or ServerLimits()
    config = uvicorn.Config(
        app, host=host, port=port, http=http_protocol(limits), ws="none", timeout_keep_alive=limits.keep_alive_s,
        log_config=None, log_level=log_level, access_log=False, **options,
    )
    if takes_signals:
        return uvicorn.Server(config)

    class SignalsLeftAlone(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return SignalsLeftAlone(config)


def run_in_thread(server: uvicorn.Server, start_timeout_s: float = 10.0) -> threading.Thread:
    """Serve on a daemon thread of its own, beside a program's event loop (which keeps its own signal handlers:
    uvicorn takes SIGTERM/SIGINT only on the main thread); returns once it listens. Stop: `should_exit = True`."""
    thread = threading.Thread(target=server.run, daemon=True, name="http-server")
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the server on {server.config.host}:{server.config.port} did not start")
        time.sleep(0.02)
    return thread


class BearerBeforeBody:
    """ASGI middleware: a request with a method other than GET or HEAD must carry `token` (the `what` token, as
    errors name it) as its bearer token (401), and declare a Content-Length (411) of at most `max_body_bytes` (413), all checked before the app runs,
    so no body is read or parsed for a caller without the token. The token is compared in constant time and never
    echoed. A refusal closes the connection: the server does not read a body it refused."""

    OPEN_METHODS = frozenset({"GET", "HEAD"})

    def __init__(self, app: ASGIApp, token: str, max_body_bytes: int, what: str) -> None:
        if not token:
            raise ValueError(f"a server's writes need a non-empty {what} token")
        self.app, self.what = app, what
        self.expected = token.encode()
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in self.OPEN_METHODS:
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(dict(scope["headers"]))
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, detail = refusal
        body = json.dumps({"detail": detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def refusal(self, headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        """(status, detail) for a request that must not reach the app, else None."""
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return 401, f"missing {self.what} bearer token"
        if not hmac.compare_digest(token.strip(), self.expected):
            return 401, f"wrong {self.what} token"
        declared = headers.get(b"content-length")
        if declared is None:
            return 411, "a Content-Length is required"
        if not declared.isdigit() or int(declared) > self.max_body_bytes:
            return 413, f"request body over the limit of {self.max_body_bytes} bytes"
        return None
