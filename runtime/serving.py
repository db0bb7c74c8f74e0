"""What every harnessrl HTTP server shares. `BearerBeforeBody`: for servers whose writes need a token, the token
and the declared body size are checked before the app reads a byte of the body (FastAPI parses a route's body
before its dependencies run, so a token check in a dependency came after the body was in memory).
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send


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
