"""The do-nothing forwarder: the harnessrl proxy's own HTTP stack relaying OpenAI Chat calls, and nothing else.

    .venv/bin/python benchmarks/proxy/forwarder.py PORT ENGINE_URL [PROCESSES]

uvicorn on uvloop + httptools, a plain ASGI function and the proxy's upstream client
(runtime/proxy/upstream_http.py), on the proxy's allocator (mimalloc, allocator.py), as the proxy serves a call;
it reads the body, posts it to the engine and relays the answer, or its stream read by read, unparsed. Its CPU per
call is the floor of that stack: what any proxy built on it spends before parsing, capturing, linking, journaling
or rendering anything. `floor.py` measures it one call at a time; `run.py --targets ...,forwarder` under the
same load as the other targets, with as many processes as the harnessrl proxy has workers (PROCESSES > 1: that
many children share PORT through SO_REUSEPORT, as a replica's workers share theirs, and the parent only waits for
them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

from harnessrl.runtime.proxy.allocator import use_mimalloc
from harnessrl.runtime.proxy.upstream_http import Limits, UpstreamPool
from harnessrl.runtime.proxy.workers import bind_socket, die_with_parent


def serve(port: int, engine_url: str, shared_port: bool) -> None:
    import uvicorn
    from harnessrl.runtime.proxy.asgi import Answer, read_body

    pools: list[UpstreamPool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/health":
            await Answer(b"ok").send(send, receive)
            return
        if not pools:  # made on the server's own loop
            pools.append(UpstreamPool(Limits()))
        body = await read_body(scope, receive, 1 << 26)
        upstream = await pools[0].request("POST", f"{engine_url}/v1/chat/completions", body,
                                          {"content-type": "application/json"})
        try:
            content_type = upstream.headers.get("content-type", "")
            if not content_type.startswith("text/event-stream"):
                await Answer(await upstream.read(), upstream.status).send(send, receive)
                return
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", content_type.encode())]})
            while data := await upstream.readany():
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            upstream.release()

    # The event loop and HTTP parser runtime/proxy/main.py runs the proxy with.
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                                           log_level="warning", access_log=False))
    server.run(sockets=[bind_socket("127.0.0.1", port, shared=True)] if shared_port else None)


def supervise(port: int, engine_url: str, processes: int) -> None:
    """`processes` forwarders on one port; SIGTERM stops them all."""
    argv = [sys.executable, os.path.abspath(__file__), str(port), engine_url, "1", "--shared-port"]
    children = [subprocess.Popen(argv, preexec_fn=die_with_parent) for _ in range(processes)]

    def stop(*_: Any) -> None:
        for child in children:
            child.terminate()

    signal.signal(signal.SIGTERM, stop)
    for child in children:
        child.wait()


if __name__ == "__main__":
    use_mimalloc()  # the allocator `harnessrl proxy` runs on, so this stays the floor of the same stack
    port, engine, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1
    if count > 1:
        supervise(port, engine, count)
    else:
        serve(port, engine, shared_port="--shared-port" in sys.argv)
