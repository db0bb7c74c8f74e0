"""CPU time of each stage of the harnessrl proxy's work for one call, in-process and without HTTP.

    .venv/bin/python benchmarks/proxy/stages.py [--turns 20] [--repeat 3] [--best-of 1] [--tools 1]

Plays the benchmark's sessions (every dialect, streamed and not) through the proxy's own functions, with the
engine stand-in's own rendering of the upstream answers, and reports the mean CPU milliseconds per call of each
stage: where the proxy's CPU per call goes, before any socket, event loop or contention is involved. The
whole-server figure (run.py) adds the HTTP server, the upstream client and the event loop on top.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The repo root for tests.fakes (the scripted engine), after the stdlib: its operator/ folder would shadow it.
sys.path.append(str(Path(__file__).resolve().parents[2]))

from harnessrl.runtime.contracts.proxy import CreateSessionRequest
from harnessrl.runtime.proxy.capture import CallCapture
from harnessrl.runtime.proxy.dialects.routes import dialect_for, match_route
from harnessrl.runtime.proxy.dialects.upstream import CompletionChunk
from harnessrl.runtime.proxy.engines import upstream_json
from harnessrl.runtime.proxy.journal import Journal
from harnessrl.runtime.proxy.sessions import SessionStore
from pydantic_core import to_json
from workload import (
    DIALECTS,
    TOOL_COMMAND,
    TOOL_NAME,
    TOOLS_HELP,
    Reply,
    SessionWorkload,
    ToolCall,
    tool_output,
)

from tests.fakes.scripted_engine import (
    Script,
    ScriptedEngine,
    ScriptedReply,
    ScriptedToolCall,
    chat_response,
    make_tokenizer,
    stream_chunks,
)
from tests.fakes.vllm_wire import COMPACT


class Clock:
    """CPU milliseconds by stage, and by the session (dialect, streaming) being played."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)
        self.by_mix: dict[str, float] = defaultdict(float)
        self.calls_by_mix: dict[str, int] = defaultdict(int)
        self.mix = ""

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        began = time.process_time()
        yield
        spent = (time.process_time() - began) * 1000
        self.ms[stage] += spent
        self.by_mix[self.mix] += spent


async def _aiter(items: list[CompletionChunk]) -> AsyncIterator[CompletionChunk]:
    for item in items:
        yield item


async def _drain(stream: AsyncIterator[bytes]) -> int:
    return sum([len(b) async for b in stream])


def _run(coroutine: Coroutine[Any, Any, int]) -> int:
    """Run a coroutine that never waits (its chunks are all in memory) without an event loop run per call: the
    server's renderer runs inside its one loop, so what counts is the renderer's work, not asyncio's setup."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return int(done.value)
    coroutine.close()
    raise RuntimeError("the renderer waited on something")


def play(clock: Clock, turns: int, model: str = "tiny", tools: int = 1) -> int:
    """One session per dialect x streaming mode; returns the number of calls."""
    engine = ScriptedEngine(make_tokenizer("fast"), model=model, record_calls=False)
    call = ScriptedToolCall(name=TOOL_NAME, arguments={"command": TOOL_COMMAND})
    engine.set_script(Script(replies=[ScriptedReply(tool_calls=[call])]))
    store = SessionStore(default_budget=200, ttl_s=3600)
    calls = 0
    for dialect_name in DIALECTS:
        for stream in (False, True):
            work = SessionWorkload(dialect_name, stream, "key", model, tools=tools)
            clock.mix = f"{dialect_name} {'stream' if stream else 'json'}"
            session, _ = store.create(
                CreateSessionRequest(rollout_id="r", task_id="t", harness="h", group_id="g")
            )
            for _ in range(turns):
                request = work.request()
                path, _, query = request.path.partition("?")
                route = match_route(path, dict([query.split("=")]) if query else {})
                assert route is not None
                dialect = dialect_for(route)
                with clock("1 parse dialect request"):
                    parsed = dialect.parse_request(request.body, route, session.history)
                with clock("2 build + encode upstream body"):
                    body = upstream_json(parsed.canonical, model, session.upstream_messages, training=True, stream=stream)
                upstream = json.loads(body)
                completion = engine.complete(upstream)
                # The answer's bytes as vLLM (and the stand-in) write them: compact JSON.
                capture = CallCapture(known=session.prompt_prefix)
                if stream:
                    lines = [json.dumps(c, separators=COMPACT).encode()
                             for c in stream_chunks(completion, upstream, "id", 0)]
                    with clock("3-4 parse + capture upstream answer"):
                        chunks = [capture.read_chunk(line) for line in lines]
                else:
                    raw = json.dumps(chat_response(completion, upstream, "id", 0), separators=COMPACT).encode()
                    with clock("3-4 parse + capture upstream answer"):
                        whole = capture.read_completion(raw)
                with clock("5 make turn"):
                    turn = capture.to_turn(model=model, policy_version=0, started_at=0.0, finished_at=0.0)
                with clock("6 link turn + journal delta"):
                    record = session.record_call(answered=True, turn=turn, prompt_text=capture.prompt_text)
                with clock("7 encode journal record"):
                    Journal.encode(record)
                with clock("8 render answer"):
                    if stream:
                        size = _run(_drain(dialect.render_stream(_aiter(chunks), parsed)))
                    else:  # encoded as the server's JSON answers are
                        size = len(to_json(dialect.render_response(whole, parsed)))
                assert size > 0
                made = [
                    ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
                    for c in completion.tool_calls
                ]
                work.record_turn(Reply(made), _OUTPUT)
                clock.calls_by_mix[clock.mix] += 1
                calls += 1
    return calls


_OUTPUT = tool_output(1, 500)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/proxy/stages.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tools", type=int, default=1, help=TOOLS_HELP)
    parser.add_argument(
        "--best-of", type=int, default=1,
        help="measure this many times and keep each figure's lowest: steadier on a machine whose speed drifts",
    )
    args = parser.parse_args(argv)
    stage_ms: dict[str, float] = {}
    mix_ms: dict[str, float] = {}
    for _ in range(args.best_of):
        clock = Clock()
        calls = sum(play(clock, args.turns, tools=args.tools) for _ in range(args.repeat))
        for stage, ms in [*clock.ms.items(), ("total", sum(clock.ms.values()))]:
            stage_ms[stage] = min(stage_ms.get(stage, float("inf")), ms / calls)
        for mix, ms in clock.by_mix.items():
            mix_ms[mix] = min(mix_ms.get(mix, float("inf")), ms / clock.calls_by_mix[mix])
    print(
        f"harnessrl proxy stages, CPU ms per call (mean over {calls} calls, {args.turns}-turn sessions of "
        f"{args.tools} tool(s), every dialect, streamed and not; lowest of {args.best_of} runs):"
    )
    print("| stage | ms/call |\n|---|---|")
    for stage, ms in sorted(stage_ms.items(), key=lambda item: (item[0] == "total", item[0])):
        print(f"| {stage} | {ms:.3f} |")
    print("\n| session | ms/call |\n|---|---|")
    for mix, ms in mix_ms.items():
        print(f"| {mix} | {ms:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
