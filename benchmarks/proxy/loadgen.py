"""The load generator: plays concurrent multi-turn agent sessions against one target and times every call.

One asyncio loop (uvloop) with one pool of keep-alive HTTP/1.1 connections per client process (the proxy's own
upstream client, runtime/proxy/upstream_http.py); `run_clients` spreads the sessions over several processes so the client is not what saturates, and
each process reports its own CPU time and event loop lag so the report can show that. Sessions start spread over
the first pause (no thundering herd), then each one waits `pause_s` between the end of a call and the next call,
as a harness running a tool would; with `pause_spread` each pause is drawn from pause_s × [1 - spread, 1 + spread]
instead (tools that take different times), which keeps sessions from calling in step.

A session ends at its first failed call (as a harness that gives up would); it has *finished* when all its turns
succeeded. Calls still in flight at the level's deadline are cut and counted apart from errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from harnessrl.runtime.proxy.upstream_http import Limits, UpstreamPool
from workload import DIALECTS, Reply, ReplyError, SessionPlan, SessionWorkload, output_seed, tool_output

OUTPUT_POOL = 61  # distinct tool outputs per client process, picked per (session, turn)


@dataclass(frozen=True)
class TargetSpec:
    """Where the sessions go. `keys[i]` is session i's API key (the proxy's session id) and `urls[i]` its base URL
    (what `POST /sessions` answered; None: `base_url` for all); `baseline_fields` set means this is the engine
    itself, sent the OpenAI-chat body the proxy would send."""

    name: str
    base_url: str
    model: str
    keys: list[str]
    baseline_fields: dict[str, Any] | None = None
    urls: list[str] | None = None


@dataclass(frozen=True)
class LoadSpec:
    sessions: int
    turns: int
    pause_s: float
    stream_fraction: float = 0.5
    tool_tokens: int = 500
    tools: int = 1  # tool definitions each session sends (workload.tool_specs)
    call_timeout_s: float = 60.0
    duration_limit_s: float = 600.0  # from the start of the level; calls in flight then are cut
    pause_spread: float = 0.0  # 0: every pause is pause_s, as the levels are defined

    def pause(self, session: int, turn: int) -> float:
        """The pause after `session`'s call `turn`: pause_s, or with a spread one from an even, deterministic
        sequence over pause_s × [1 - spread, 1 + spread] (its mean is pause_s, so the call rate is the same)."""
        if not self.pause_spread:
            return self.pause_s
        # Additive recurrences (golden ratio by session, plastic number by turn): even in both, and a
        # session's next pause is not tied to its last.
        u = (session * 0.6180339887498949 + turn * 0.7548776662466927) % 1.0
        return self.pause_s * (1.0 + self.pause_spread * (2.0 * u - 1.0))


@dataclass(frozen=True)
class CallRecord:
    session: int
    turn: int
    dialect: str
    stream: bool
    started_s: float  # since the level's start
    latency_s: float
    outcome: str  # "ok", "cut" (in flight at the deadline), or an error description


@dataclass
class ClientStats:
    cpu_s: float = 0.0
    wall_s: float = 0.0
    lag_samples_s: list[float] = field(default_factory=list)


@dataclass
class WorkerResult:
    records: list[CallRecord]
    finished_sessions: int
    client: ClientStats


# --------------------------------------------------------------------------------------------- HTTP/1.1


async def post_whole(http: UpstreamPool, url: str, headers: dict[str, str], body: bytes, timeout_s: float) -> tuple[int, bytes]:
    """The answer's status and whole body (a stream read to its end), within `timeout_s` for the whole call."""
    async with asyncio.timeout(timeout_s):
        response = await http.request("POST", url, body, headers)
        try:
            return response.status, await response.read()
        finally:
            response.release()


# --------------------------------------------------------------------------------------------- one session


async def _call(http: UpstreamPool, base_url: str, work: SessionWorkload, timeout_s: float) -> Reply:
    request = work.request()
    status, raw = await post_whole(http, base_url + request.path, request.headers, request.body, timeout_s)
    if status != 200:
        raise ReplyError(f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}")
    return work.parse_stream(raw) if work.stream else work.parse(raw)


async def _session(
    http: UpstreamPool,
    target: TargetSpec,
    spec: LoadSpec,
    index: int,
    start: float,
    outputs: list[str],
    records: list[CallRecord],
) -> bool:
    plan = SessionPlan.of(index, spec.stream_fraction)
    work = SessionWorkload(
        plan.dialect, plan.stream, target.keys[index], target.model, baseline_fields=target.baseline_fields,
        tools=spec.tools,
    )
    label = "openai_chat" if target.baseline_fields is not None else plan.dialect
    base_url = target.urls[index] if target.urls is not None else target.base_url
    # Spread session starts over one pause (golden-ratio offsets: even at any session count).
    await asyncio.sleep(
        max(0.0, start + spec.pause_s * (index * 0.6180339887498949 % 1.0) - time.perf_counter())
    )
    for turn in range(spec.turns):
        began = time.perf_counter()
        try:
            reply = await _call(http, base_url, work, spec.call_timeout_s)
            outcome = "ok"
        except asyncio.CancelledError:
            records.append(
                CallRecord(index, turn, label, plan.stream, began - start, time.perf_counter() - began, "cut")
            )
            raise
        except Exception as exc:  # any failure of the call is its outcome (HTTP, transport, timeout, shape)
            outcome = f"{type(exc).__name__}: {exc}"[:200] or type(exc).__name__
        records.append(
            CallRecord(index, turn, label, plan.stream, began - start, time.perf_counter() - began, outcome)
        )
        if outcome != "ok":
            return False
        try:
            work.record_turn(reply, outputs[output_seed(index, turn) % len(outputs)])
        except ReplyError as exc:
            records[-1] = CallRecord(
                index, turn, label, plan.stream, began - start, records[-1].latency_s, str(exc)[:200]
            )
            return False
        if turn + 1 < spec.turns:
            await asyncio.sleep(spec.pause(index, turn))
    return True


async def _lag_monitor(samples: list[float], period_s: float = 0.05) -> None:
    """How late the loop wakes a sleeper: a saturated client shows up here before anywhere else."""
    while True:
        began = time.perf_counter()
        await asyncio.sleep(period_s)
        samples.append(time.perf_counter() - began - period_s)


async def run_sessions(
    target: TargetSpec, spec: LoadSpec, indices: list[int], start_wall: float
) -> WorkerResult:
    """Play the sessions `indices`; the level starts at the wall-clock time `start_wall`."""
    outputs = [tool_output(seed, spec.tool_tokens) for seed in range(OUTPUT_POOL)]
    records: list[CallRecord] = []
    stats = ClientStats()
    # The proxy's own HTTP/1.1 client (a keep-alive pool on httptools): aiohttp's per-chunk stream machinery
    # was most of the client's CPU per streamed call. Idle connections are dropped before the server's own
    # keep-alive timeout (uvicorn: 5 s) could close one under a request.
    http = UpstreamPool(Limits(max_connections=1 << 20, keepalive_expiry_s=4.0, connect_timeout_s=spec.call_timeout_s,
                               read_timeout_s=spec.call_timeout_s, pool_timeout_s=spec.call_timeout_s))
    try:
        await asyncio.sleep(max(0.0, start_wall - time.time()))
        start = time.perf_counter()
        cpu0 = time.process_time()
        lag = asyncio.create_task(_lag_monitor(stats.lag_samples_s))
        tasks = [
            asyncio.create_task(_session(http, target, spec, i, start, outputs, records)) for i in indices
        ]
        done, pending = await asyncio.wait(
            tasks, timeout=max(0.0, start + spec.duration_limit_s - time.perf_counter())
        )
        for task in pending:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*pending, return_exceptions=True)
        lag.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lag
        stats.cpu_s = time.process_time() - cpu0
        stats.wall_s = time.perf_counter() - start
    finally:
        await http.close()
    finished = sum(1 for t in done if not t.cancelled() and t.exception() is None and t.result())
    return WorkerResult(records, finished, stats)


def _worker(target: TargetSpec, spec: LoadSpec, indices: list[int], start_wall: float) -> WorkerResult:
    raise_fd_limit()
    try:
        import uvloop
    except ImportError:  # plain asyncio works, at a higher client cost per call
        return asyncio.run(run_sessions(target, spec, indices, start_wall))
    return uvloop.run(run_sessions(target, spec, indices, start_wall))


def run_clients(
    target: TargetSpec, spec: LoadSpec, procs: int, start_delay_s: float = 2.0
) -> list[WorkerResult]:
    """Run all `spec.sessions` sessions over `procs` client processes (session i goes to process i % procs)."""
    procs = max(1, min(procs, spec.sessions))
    shares = [list(range(p, spec.sessions, procs)) for p in range(procs)]
    start_wall = time.time() + start_delay_s
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=procs, mp_context=context) as pool:
        futures = [pool.submit(_worker, target, spec, share, start_wall) for share in shares]
        return [f.result() for f in futures]


def raise_fd_limit() -> int:
    """Lift the soft open-files limit to the hard one (thousands of sessions = thousands of sockets)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return wanted


__all__ = [
    "DIALECTS",
    "CallRecord",
    "LoadSpec",
    "TargetSpec",
    "WorkerResult",
    "raise_fd_limit",
    "run_clients",
]
