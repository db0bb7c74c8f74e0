"""The do-nothing forwarder: the harnessrl proxy's own HTTP stack relaying OpenAI Chat calls, and nothing else.

    .venv/bin/python benchmarks/proxy/forwarder.py PORT ENGINE_URL

uvicorn on uvloop + httptools, a plain ASGI function and the proxy's upstream client
(runtime/proxy/upstream_http.py), as the proxy serves a call; it reads the body, posts it to the engine and
relays the answer, or its stream read by read, unparsed. Its CPU per call is the floor of that stack: what any
proxy built on it spends before parsing, capturing, linking, journaling or rendering anything. `floor.py`
measures it one call at a time; `run.py --targets ...,forwarder` under the same load as the other targets.
"""

from __future__ import annotations

import sys
from typing import Any

from harnessrl.runtime.proxy.upstream_http import Limits, UpstreamPool


def serve(port: int, engine_url: str) -> None:
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
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2])
