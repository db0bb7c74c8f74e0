"""The proxy's CPU per call against the floor of its stack, with one call in flight at a time (low noise).

    .venv/bin/python benchmarks/proxy/floor.py [--sessions 6] [--turns 20]

Plays the benchmark's OpenAI Chat sessions (the only dialect the engine stand-in reads as is), streamed and not,
one call at a time, against two servers in front of the same engine stand-in: the harnessrl proxy, and the
do-nothing forwarder (forwarder.py: the proxy's own HTTP stack relaying the body and the answer unparsed). The
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from harnessrl.runtime.proxy.upstream_http import Limits, UpstreamPool
from loadgen import post_whole
from run import MODEL, engine_script
from servers import ProcessGroup, Server, create_sessions, start_engine, start_forwarder, start_harnessrl
from workload import SessionWorkload, output_seed, tool_output


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
    args = parser.parse_args(argv)
    group = ProcessGroup()
    work_dir = Path(tempfile.mkdtemp(prefix="proxy-floor-"))
    try:
        engine = start_engine(group, work_dir, engine_script(), MODEL)
        engine_url = f"http://127.0.0.1:{engine.port}"
        proxy, token = start_harnessrl(group, work_dir, engine_url, MODEL, {})
        forwarder = start_forwarder(group, work_dir, engine_url)
        load = " ".join(f"{x:.2f}" for x in psutil.getloadavg())
        print(f"CPU ms per call, OpenAI Chat sessions of {args.turns} turns, one call at a time, "
              f"{args.sessions * args.turns} calls per figure (load average {load}):")
        print("| calls | harnessrl proxy | do-nothing forwarder (floor) |\n|---|---|---|")
        warm = [sid for sid, _ in create_sessions("harnessrl", proxy.url, token, 2, "floor-warm")]
        for stream in (False, True):  # first calls import and build lazily: keep them out of the figures
            cpu_ms_per_call(proxy, [warm[int(stream)]], stream, 3)
            cpu_ms_per_call(forwarder, ["none"], stream, 3)
        for stream in (False, True):
            sids = [sid for sid, _ in create_sessions("harnessrl", proxy.url, token, args.sessions, f"floor-{stream}")]
            ours = cpu_ms_per_call(proxy, sids, stream, args.turns)
            floor = cpu_ms_per_call(forwarder, ["none"] * args.sessions, stream, args.turns)
            print(f"| {'streamed' if stream else 'not streamed'} | {ours:.2f} | {floor:.2f} |", flush=True)
    finally:
        group.stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
