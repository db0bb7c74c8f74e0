"""The proxy's CPU per call against the floor of its stack, with one call in flight at a time (low noise).

    .venv/bin/python benchmarks/proxy/floor.py [--sessions 6] [--turns 20]

Plays the benchmark's OpenAI Chat sessions (the only dialect the engine stand-in reads as is), streamed and not,
one call at a time, against two servers in front of the same engine stand-in: the harnessrl proxy, and a
forwarder on the proxy's own stack that does nothing else (uvicorn on uvloop + httptools, a plain ASGI function,
the proxy's upstream client: it reads the body, posts it to the engine and relays the answer or its stream
unparsed). The
forwarder's CPU per call is the floor of that stack on this machine; the difference is what capturing costs.
With one call in flight, contention and queueing stay out of the figure, so two runs compare well (e.g. a
git revision's package through PYTHONPATH, as compare.sh does, against the working tree's).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from harnessrl.runtime.proxy.upstream_http import Limits, UpstreamPool
from loadgen import post_whole
from run import MODEL, engine_script
from servers import ProcessGroup, Server, create_sessions, free_port, start_engine, start_harnessrl
from workload import SessionWorkload, output_seed, tool_output


def serve_forwarder(port: int, engine_url: str) -> None:
    """The do-nothing forwarder (runs in its own process): the proxy's own HTTP stack, nothing else."""
    import uvicorn
    from harnessrl.runtime.proxy.asgi import Answer, read_body

    pools: list[UpstreamPool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/health":
            await Answer(b"ok").send(send, receive)
            return
        if not pools:
            pools.append(UpstreamPool(Limits()))
        body = await read_body(scope, receive, 1 << 26)
        upstream = await pools[0].request("POST", f"{engine_url}/v1/chat/completions", body,
                                          {"content-type": "application/json"})
        try:
            content_type = upstream.headers.get("content-type", "")
            if not content_type.startswith("text/event-stream"):
                await Answer(await upstream.read()).send(send, receive)
                return
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", content_type.encode())]})
            while data := await upstream.readany():
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            upstream.release()

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False)


async def play(url: str, keys: list[str], stream: bool, turns: int) -> None:
    """One session per key, one after the other, one call at a time."""
    http = UpstreamPool(Limits())
    try:
        for s, key in enumerate(keys):
            work = SessionWorkload("openai_chat", stream, key, MODEL)
            for t in range(turns):
                request = work.request()
                status, raw = await post_whole(http, url + request.path, request.headers, request.body, 60)
                if status != 200:
                    raise RuntimeError(f"{url}: HTTP {status}: {raw[:300].decode(errors='replace')}")
                reply = work.parse_stream(raw) if stream else work.parse(raw)
                work.record_turn(reply, tool_output(output_seed(s, t), 500))
    finally:
        await http.close()


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
