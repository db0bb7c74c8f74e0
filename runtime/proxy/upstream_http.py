"""The proxy's HTTP/1.1 client to its engines: a keep-alive connection pool on asyncio protocols + httptools.

Why not a general client: the proxy makes one kind of call (a POST of JSON to a few vLLM servers on a private
network, plain HTTP, an answer of JSON or SSE), hundreds of times a second, and at that rate the general clients'
per-request machinery was a large share of its CPU (httpx/httpcore's pool scan, encode/httpcore#1035; aiohttp's
request/response objects, timers and stream readers: ~0.3 ms per call here, `benchmarks/proxy/floor.py`). Here a
call is one write of a pre-built request and the parser's callbacks filling a buffer; the pool is a deque per
engine. The parser is httptools (llhttp, Node's parser), so framing (content-length, chunked, keep-alive) is
not hand-written.

Errors: `UpstreamConnectError` when the engine cannot be reached (the caller may fail over), `UpstreamBroken`
when a connection broke before or during the answer (a kept-alive connection the engine closed as it was reused
is the common case), `TimeoutError` for silence past the read timeout or no free connection in time.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools


class UpstreamError(ConnectionError):
    """A transport failure talking to an engine."""


class UpstreamConnectError(UpstreamError):
    """The engine could not be reached (refused, unresolvable, connect timeout)."""


class UpstreamBroken(UpstreamError):
    """The connection closed or sent something that is not HTTP before the answer was complete."""


@dataclass(frozen=True)
class Limits:
    max_connections: int = 1024
    keepalive_expiry_s: float = 3.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0
    pool_timeout_s: float = 30.0


class _Connection(asyncio.Protocol):
    """One TCP connection; carries one request at a time and collects its answer as the parser reports it."""

    def __init__(self, origin: _Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body: deque[bytes] = deque()
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamBroken(f"the engine's answer is not valid HTTP: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.origin.forget(self)
        if not self.complete:
            self._fail(UpstreamBroken(f"the engine closed the connection ({type(exc).__name__ if exc else 'EOF'})"))

    # -- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # only valid inside the parser's callbacks
        self._wake()

    # -- the caller's side

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    async def wait(self, timeout_s: float) -> None:
        """Until the parser reports progress (or the connection breaks, or `timeout_s` of silence)."""
        if self.error is not None:
            raise self.error
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        timer = loop.call_later(timeout_s, self._fail, TimeoutError(f"the engine sent nothing for {timeout_s:g} s"))
        try:
            await self.waiter
        finally:
            timer.cancel()
            self.waiter = None
        if self.error is not None and not (self.body or self.complete):
            raise self.error

    def send(self, request: bytes) -> None:
        self._reset()
        assert self.transport is not None
        self.transport.write(request)

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and self.error is None and self.transport is not None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        self.origin.forget(self)


class UpstreamResponse:
    """An answer being received. `read`/`readany` return the body; `release` hands the connection back to the pool
    (or closes it when the answer was not read to its end). Release it exactly once, whatever happens."""

    def __init__(self, connection: _Connection, read_timeout_s: float) -> None:
        self._connection = connection
        self._read_timeout_s = read_timeout_s
        self.status = connection.status
        self.headers = connection.headers

    async def readany(self) -> bytes:
        """The body bytes received since the last call, waiting for some; b"" once the body is complete."""
        connection = self._connection
        while not connection.body:
            if connection.complete:
                return b""
            await connection.wait(self._read_timeout_s)
        if len(connection.body) == 1:
            return connection.body.popleft()
        data = b"".join(connection.body)
        connection.body.clear()
        return data

    async def read(self) -> bytes:
        pieces = []
        while data := await self.readany():
            pieces.append(data)
        return b"".join(pieces)

    def release(self) -> None:
        self._connection.origin.give_back(self._connection)


class _Origin:
    """The pool of one engine (scheme://host:port): idle connections, newest last."""

    def __init__(self, pool: UpstreamPool, host: str, port: int, authority: str) -> None:
        self.pool, self.host, self.port, self.authority = pool, host, port, authority
        self.idle: deque[_Connection] = deque()
        self.open: set[_Connection] = set()

    def forget(self, connection: _Connection) -> None:
        if connection in self.open:
            self.open.discard(connection)
            self.pool.slot_freed()

    def give_back(self, connection: _Connection) -> None:
        if connection.reusable():
            connection.idle_since = time.monotonic()
            self.idle.append(connection)
            self.pool.connection_idle()
        else:
            connection.close()

    def take_idle(self) -> _Connection | None:
        """The most recently used idle connection that the engine has not closed; older expired ones are closed."""
        expiry = time.monotonic() - self.pool.limits.keepalive_expiry_s
        while self.idle:
            connection = self.idle.pop()
            if connection.transport is not None and connection.idle_since >= expiry:
                return connection
            connection.close()
        return None

    async def connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        connection = _Connection(self)
        self.open.add(connection)
        try:
            async with asyncio.timeout(self.pool.limits.connect_timeout_s):
                await loop.create_connection(lambda: connection, self.host, self.port)
        except (OSError, TimeoutError) as exc:
            self.forget(connection)
            raise UpstreamConnectError(f"cannot connect to {self.authority}: {type(exc).__name__}: {exc}") from exc
        except BaseException:
            connection.close()
            raise
        return connection


class UpstreamPool:
    """Keep-alive connections to every engine, at most `limits.max_connections` open in all."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._origins: dict[str, _Origin] = {}
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def _origin(self, url: str) -> tuple[_Origin, str]:
        parts = urlsplit(url)
        authority = parts.netloc
        origin = self._origins.get(authority)
        if origin is None:
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"engine URL {url!r}: only http://host[:port] is supported")
            origin = self._origins[authority] = _Origin(self, parts.hostname, parts.port or 80, authority)
        target = parts.path or "/"
        return origin, f"{target}?{parts.query}" if parts.query else target

    def slot_freed(self) -> None:
        self._open -= 1
        self._wake_one()

    def connection_idle(self) -> None:
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _connection(self, origin: _Origin) -> _Connection:
        deadline = time.monotonic() + self.limits.pool_timeout_s
        while True:
            connection = origin.take_idle()
            if connection is not None:
                return connection
            if self._open < self.limits.max_connections:
                self._open += 1
                return await origin.connect()
            if not self._close_one_idle():
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                try:
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        await waiter
                except TimeoutError:
                    raise TimeoutError(
                        f"no free upstream connection within {self.limits.pool_timeout_s:g} s"
                    ) from None

    def _close_one_idle(self) -> bool:
        """At the limit, an idle connection to another engine makes room for a new one."""
        for origin in self._origins.values():
            if origin.idle:
                origin.idle.popleft().close()
                return True
        return False

    async def request(self, method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None,
                      read_timeout_s: float | None = None) -> UpstreamResponse:
        """Send a request and wait for the answer's status and headers. The body follows through the response,
        which the caller must release."""
        origin, target = self._origin(url)
        head = [f"{method} {target} HTTP/1.1\r\nhost: {origin.authority}\r\ncontent-length: {len(body)}\r\n"]
        head.extend(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        head.append("\r\n")
        payload = "".join(head).encode("latin-1") + body
        timeout_s = self.limits.read_timeout_s if read_timeout_s is None else read_timeout_s
        connection = await self._connection(origin)
        try:
            connection.send(payload)
            while not connection.headers_done:
                await connection.wait(timeout_s)
        except BaseException:
            connection.close()
            raise
        return UpstreamResponse(connection, timeout_s)

    async def close(self) -> None:
        for origin in self._origins.values():
            for connection in [*origin.idle, *origin.open]:
                connection.close()
            origin.idle.clear()
