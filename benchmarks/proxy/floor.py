"""The proxy's CPU per call against the floor of its stack, with one call in flight at a time (low noise).

    .venv/bin/python benchmarks/proxy/floor.py [--sessions 6] [--turns 20]

Plays the benchmark's OpenAI Chat sessions (the only dialect the engine stand-in reads as is), streamed and not,
one call at a time, against two servers in front of the same engine stand-in: the harnessrl proxy, and a
forwarder on the same stack that does nothing else (uvicorn on uvloop + httptools, a Starlette route, one aiohttp
client session: it reads the body, posts it to the engine and relays the answer or its stream unparsed). The
forwarder's CPU per call is the floor of that stack on this machine; the difference is what capturing costs.
With one call in flight, contention and queueing stay out of the figure, so two runs compare well (e.g. a
git revision's package through PYTHONPATH, as compare.sh does, against the working tree's).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
import psutil
from run import MODEL, engine_script
from servers import ProcessGroup, Server, create_sessions, free_port, start_engine, start_harnessrl
from workload import SessionWorkload, output_seed, tool_output


def serve_forwarder(port: int, engine_url: str) -> None:
    """The do-nothing forwarder (runs in its own process)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    clients: list[aiohttp.ClientSession] = []

    async def forward(request: Request) -> Response:
        if not clients:
            clients.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024, limit_per_host=0)))
        body = await request.body()
        upstream = await clients[0].post(f"{engine_url}/v1/chat/completions", data=body,
                                         headers={"content-type": "application/json"})
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):

            async def relay() -> AsyncIterator[bytes]:
                try:
                    async for data in upstream.content.iter_any():
                        yield data
                finally:
                    upstream.release()

            return StreamingResponse(relay(), media_type="text/event-stream")
        try:
            return Response(await upstream.read(), media_type="application/json")
        finally:
            upstream.release()

    async def health(_: Request) -> Response:
        return Response(b"ok")

    app = Starlette(routes=[Route("/v1/chat/completions", forward, methods=["POST"]), Route("/health", health)])
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False)


async def play(url: str, keys: list[str], stream: bool, turns: int) -> None:
    """One session per key, one after the other, one call at a time."""
    async with aiohttp.ClientSession() as http:
        for s, key in enumerate(keys):
            work = SessionWorkload("openai_chat", stream, key, MODEL)
            for t in range(turns):
                request = work.request()
                async with http.post(url + request.path, data=request.body, headers=request.headers) as response:
                    if response.status != 200:
                        raise RuntimeError(f"{url}: HTTP {response.status}: {(await response.text())[:300]}")
                    if stream:
                        reader = work.stream_reader()
                        async for line in response.content:
                            reader.feed(line.rstrip(b"\n"))
                        reply = reader.finish()
                    else:
                        reply = work.parse(await response.read())
                work.record_turn(reply, tool_output(output_seed(s, t), 500))


def cpu_ms_per_call(server: Server, keys: list[str], stream: bool, turns: int) -> float:
    before = server.cpu_s()
    asyncio.run(play(server.url, keys, stream, turns))
    return (server.cpu_s() - before) * 1000 / (len(keys) * turns)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/proxy/floor.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "ENGINE_URL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve_forwarder(int(args.serve[0]), args.serve[1])
        return 0
    group = ProcessGroup()
    work_dir = Path(tempfile.mkdtemp(prefix="proxy-floor-"))
    try:
        engine = start_engine(group, work_dir, engine_script(), MODEL)
        engine_url = f"http://127.0.0.1:{engine.port}"
        proxy, token = start_harnessrl(group, work_dir, engine_url, MODEL, {})
        port = free_port()
        argv_fwd = [sys.executable, str(Path(__file__).resolve()), "--serve", str(port), engine_url]
        forwarder = group.ready(group.add(Server("forwarder", argv_fwd, port, work_dir, ready_path="/health")), 60)
        load = " ".join(f"{x:.2f}" for x in psutil.getloadavg())
        print(f"CPU ms per call, OpenAI Chat sessions of {args.turns} turns, one call at a time, "
              f"{args.sessions * args.turns} calls per figure (load average {load}):")
        print("| calls | harnessrl proxy | do-nothing forwarder (floor) |\n|---|---|---|")
        warm = create_sessions("harnessrl", proxy.url, token, 2, "floor-warm")
        for stream in (False, True):  # first calls import and build lazily: keep them out of the figures
            cpu_ms_per_call(proxy, [warm[int(stream)]], stream, 3)
            cpu_ms_per_call(forwarder, ["none"], stream, 3)
        for stream in (False, True):
            sids = create_sessions("harnessrl", proxy.url, token, args.sessions, f"floor-{stream}")
            ours = cpu_ms_per_call(proxy, sids, stream, args.turns)
            floor = cpu_ms_per_call(forwarder, ["none"] * args.sessions, stream, args.turns)
            print(f"| {'streamed' if stream else 'not streamed'} | {ours:.2f} | {floor:.2f} |", flush=True)
    finally:
        group.stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
