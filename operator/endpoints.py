"""The operator's own HTTP endpoints, `--liveness` (the kubelet's probe) and `--metrics-port` (Prometheus), built
like every harnessrl server (runtime/serving.py: a request's head and body bounded in size and time) and served in
kopf's event loop beside the operator.

They were kopf's aiohttp liveness server and prometheus_client's thread-per-connection server, neither with a
deadline on a request's head: each slow connection held a thread, or a socket, for as long as the caller liked.
In kopf's loop, the liveness probe still fails when that loop stops answering (what kopf's own server told the
kubelet); kopf's probe handlers are not run (the operator registers none), so it answers `{}` as kopf did.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from harnessrl.runtime import serving
from harnessrl.runtime.contracts.server_limits import ServerLimits

if TYPE_CHECKING:
    import uvicorn
    from prometheus_client import CollectorRegistry

OK = (b"application/json", b"{}")
NOT_FOUND = (b"text/plain; charset=utf-8", b"Not Found")


def liveness_address(endpoint: str) -> tuple[str, int, str]:
    """(host, port, path) of a kopf-style liveness endpoint, e.g. http://0.0.0.0:8080/healthz."""
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme != "http" or parts.port is None:
        raise ValueError(f"--liveness {endpoint!r}: expected http://HOST:PORT/PATH")
    return parts.hostname or "localhost", parts.port, parts.path or "/"


def liveness_app(path: str) -> serving.ASGIApp:
    """200 `{}` for a GET of `path`, 404 for anything else."""

    async def app(scope: serving.Scope, receive: serving.Receive, send: serving.Send) -> None:
        if scope["type"] != "http":  # lifespan is off: only requests come
            return
        found = scope["method"] in ("GET", "HEAD") and scope["path"] == path
        content_type, body = OK if found else NOT_FOUND
        await send({"type": "http.response.start", "status": 200 if found else 404,
                    "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


def endpoints(liveness: str | None, metrics_port: int | None, registry: CollectorRegistry,
              limits: ServerLimits) -> list[uvicorn.Server]:
    """The servers for the endpoints asked for (none, one or both); `registry`: the operator's metrics."""
    import prometheus_client

    servers = []
    if liveness is not None:
        host, port, path = liveness_address(liveness)
        servers.append(serving.server(liveness_app(path), host, port, limits, takes_signals=False, lifespan="off"))
    if metrics_port is not None:
        metrics = prometheus_client.make_asgi_app(registry)
        servers.append(serving.server(metrics, "0.0.0.0", metrics_port, limits, takes_signals=False, lifespan="off"))
    return servers


async def serve_beside(servers: list[uvicorn.Server], operator: Awaitable[None]) -> None:
    """Run `operator` (kopf's, which takes SIGTERM/SIGINT) with `servers` on the same loop; they stop with it.
    They start first: kopf leaves the tasks it found running alone."""
    tasks = [asyncio.create_task(server.serve()) for server in servers]
    try:
        await operator
    finally:
        for server in servers:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
