"""The proxy's CPU per call against the floor of its stack, with one call in flight at a time (low noise).

    .venv/bin/python benchmarks/proxy/floor.py [--sessions 6] [--turns 20] [--tools 1]

Plays the benchmark's OpenAI Chat sessions (the only dialect the engine stand-in reads as is), streamed and not,
one call at a time, against two servers in front of the same engine stand-in: the harnessrl proxy, and the
do-nothing forwarder (forwarder.py: the proxy's own HTTP stack relaying the body and the answer unparsed). The
forwarder's CPU per call is the floor of that stack on this machine; the difference is what capturing costs.
With one call in flight, contention and queueing stay out of the figure, so two runs compare well (e.g. a
git revision's package through PYTHONPATH, as compare.sh does, against the working tree's).

With `--instructions` both servers run under valgrind's callgrind (Debian's valgrind), and the figures are the
user-space instructions each ran per call, in millions: the same count for the same work whatever else the
machine is doing (CPU time on a shared 2-core VM moves by ±15-50% between back-to-back runs), so an A/B of a
code change needs one run of each. It leaves out the kernel's share (sockets, fsync) and cache misses, so it
ranks changes to the proxy's own work; CPU time stays the figure the targets are about.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from harnessrl.runtime.proxy.upstream_http import Limits, UpstreamPool
from loadgen import post_whole
from run import MODEL, engine_script
from servers import ProcessGroup, Server, create_sessions, start_engine, start_forwarder, start_harnessrl
from workload import TOOLS_HELP, SessionWorkload, output_seed, tool_output


async def play(url: str, keys: list[str], stream: bool, turns: int, tools: int = 1) -> None:
    """One session per key, one after the other, one call at a time."""
    http = UpstreamPool(Limits())
    try:
        for s, key in enumerate(keys):
            work = SessionWorkload("openai_chat", stream, key, MODEL, tools=tools)
            for t in range(turns):
                request = work.request()
                status, raw = await post_whole(http, url + request.path, request.headers, request.body, 60)
                if status != 200:
                    raise RuntimeError(f"{url}: HTTP {status}: {raw[:300].decode(errors='replace')}")
                reply = work.parse_stream(raw) if stream else work.parse(raw)
                work.record_turn(reply, tool_output(output_seed(s, t), 500))
    finally:
        await http.close()


Meter = Callable[[Server, Callable[[], None]], float]


def cpu_ms(server: Server, run: Callable[[], None]) -> float:
    """The server's CPU milliseconds (user + system) while `run` runs."""
    before = server.cpu_s()
    run()
    return (server.cpu_s() - before) * 1000


class Callgrind:
    """Counts the instructions a server started under `wrapper(name)` runs in user space (valgrind's callgrind,
    instrumentation switched on only while a figure is measured)."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir

    def wrapper(self, name: str) -> list[str]:
        return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={self.out_dir}/{name}.%p"]

    def __call__(self, server: Server, run: Callable[[], None]) -> float:
        """Millions of instructions the server ran while `run` ran."""
        pid = str(server.pid)
        self._control("--zero", pid)
        self._control("--instr=on", pid)
        run()
        self._control("--instr=off", pid)
        self._control("--dump", pid)
        dumps = sorted(self.out_dir.glob(f"{server.name}.{pid}.*"), key=lambda p: int(p.suffix[1:]))
        totals = re.search(rb"^totals: (\d+)", dumps[-1].read_bytes(), re.MULTILINE)
        if totals is None:
            raise RuntimeError(f"no totals in {dumps[-1]}")
        return int(totals[1]) / 1e6

    @staticmethod
    def _control(*args: str) -> None:
        subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=60)


def per_call(meter: Meter, server: Server, keys: list[str], stream: bool, turns: int, tools: int = 1) -> float:
    return meter(server, lambda: asyncio.run(play(server.url, keys, stream, turns, tools))) / (len(keys) * turns)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/proxy/floor.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--tools", type=int, default=1, help=TOOLS_HELP)
    parser.add_argument("--instructions", action="store_true",
                        help="count user-space instructions under callgrind instead of measuring CPU time")
    parser.add_argument("--keep", action="store_true",
                        help="keep the working directory (server logs, callgrind dumps) and print where it is")
    args = parser.parse_args(argv)
    group = ProcessGroup()
    work_dir = Path(tempfile.mkdtemp(prefix="proxy-floor-"))
    callgrind = Callgrind(work_dir) if args.instructions else None
    meter: Meter = callgrind or cpu_ms
    try:
        engine = start_engine(group, work_dir, engine_script(), MODEL)
        engine_url = f"http://127.0.0.1:{engine.port}"
        proxy, token = start_harnessrl(group, work_dir, engine_url, MODEL, {},
                                       wrapper=callgrind.wrapper("harnessrl") if callgrind else ())
        forwarder = start_forwarder(group, work_dir, engine_url,
                                    wrapper=callgrind.wrapper("forwarder") if callgrind else ())
        load = " ".join(f"{x:.2f}" for x in psutil.getloadavg())
        unit = "Million user-space instructions" if callgrind else "CPU ms"
        print(f"{unit} per call, OpenAI Chat sessions of {args.turns} turns and {args.tools} tool(s), one call at a time, "
              f"{args.sessions * args.turns} calls per figure (load average {load}):")
        print("| calls | harnessrl proxy | do-nothing forwarder (floor) |\n|---|---|---|")
        warm = [sid for sid, _ in create_sessions("harnessrl", proxy.url, token, 2, "floor-warm")]
        for stream in (False, True):  # first calls import and build lazily: keep them out of the figures
            per_call(cpu_ms, proxy, [warm[int(stream)]], stream, 3)
            per_call(cpu_ms, forwarder, ["none"], stream, 3)
        for stream in (False, True):
            sids = [sid for sid, _ in create_sessions("harnessrl", proxy.url, token, args.sessions, f"floor-{stream}")]
            ours = per_call(meter, proxy, sids, stream, args.turns, args.tools)
            floor = per_call(meter, forwarder, ["none"] * args.sessions, stream, args.turns, args.tools)
            print(f"| {'streamed' if stream else 'not streamed'} | {ours:.2f} | {floor:.2f} |", flush=True)
    finally:
        group.stop_all()
        if args.keep:
            print(f"logs and dumps: {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
