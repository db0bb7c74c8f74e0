"""The benchmark's results: per level and target, computed from call records and process measurements, and
rendered as the Markdown tables of results.md. Pure."""

from __future__ import annotations

from collections import Counter

from loadgen import CallRecord, ClientStats
from proxy_waits import WaitSummary, render_waits
from pydantic import BaseModel, Field

TARGETS_DOC = {
    "baseline": "the same load straight to the engine stand-in (the OpenAI-chat body the proxy would send)",
    "harnessrl": "harnessrl's capture proxy (`harnessrl proxy`)",
    "openenv": "the published reference capture proxy (openenv, `python -m openenv.core.harness.capture.server`)",
}


class ProcessUsage(BaseModel):
    """A server process over one level: memory with its sessions live, CPU time over the level's calls."""

    rss_idle_mb: float
    rss_end_mb: float
    rss_peak_mb: float
    cpu_s: float
    kernel_cpu_s: float | None = None  # the part of cpu_s spent in the kernel (None in runs before it was kept)


class TargetResult(BaseModel):
    target: str
    sessions: int
    sessions_finished: int
    calls_ok: int
    errors: int
    cut_at_deadline: int
    error_kinds: dict[str, int] = Field(default_factory=dict)  # "dialect/stream: first words" -> count
    p50_ms: float | None
    p99_ms: float | None
    p50_added_ms: float | None = None
    p99_added_ms: float | None = None
    calls_per_s: float
    wall_s: float
    server: ProcessUsage | None = None
    engine_cpu_per_call_ms: float | None = None
    rss_per_session_mb: float | None = None
    cpu_per_call_ms: float | None = None
    kernel_cpu_per_call_ms: float | None = None  # the kernel's part of cpu_per_call_ms: sockets, fsync, page faults
    client_procs: int
    client_cpu_pct_max: float  # busiest client process, % of one core
    client_cpu_per_call_ms: float | None = None  # all client processes' CPU time / calls answered
    client_lag_p99_ms: float
    # The proxy's own histograms over the level (harnessrl only): its waits on the engine and on the journal.
    proxy_waits: dict[str, WaitSummary] = Field(default_factory=dict)
    note: str = ""


class LevelResult(BaseModel):
    sessions: int
    pause_s: float
    turns: int
    targets: list[TargetResult] = Field(default_factory=list)


class RunResults(BaseModel):
    command: str
    started_at: str
    finished_at: str = ""
    machine: str
    load_before: str
    proxy_config: str
    levels: list[LevelResult] = Field(default_factory=list)
    processes: list[str] = Field(default_factory=list)  # "name pid N" of every server started, all stopped
    notes: list[str] = Field(default_factory=list)


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    rank = max(1, round(q / 100.0 * len(sorted_values) + 0.5 - 1e-9))
    return sorted_values[min(len(sorted_values), rank) - 1]


def _error_kind(record: CallRecord) -> str:
    mode = "stream" if record.stream else "json"
    return f"{record.dialect}/{mode}: {record.outcome.removeprefix('ReplyError: ')[:70]}"


def _active_span(records: list[CallRecord]) -> float:
    """Seconds from the first call's start to the last call's end."""
    if not records:
        return 0.0
    return max(r.started_s + r.latency_s for r in records) - min(r.started_s for r in records)


def target_result(
    target: str,
    sessions: int,
    records: list[CallRecord],
    finished: int,
    clients: list[ClientStats],
    wall_s: float,
    server: ProcessUsage | None,
    engine_cpu_s: float | None,
    note: str = "",
) -> TargetResult:
    ok = sorted(r.latency_s for r in records if r.outcome == "ok")
    failed = [r for r in records if r.outcome not in ("ok", "cut")]
    lags = sorted(s for c in clients for s in c.lag_samples_s)
    p50, p99, lag99 = percentile(ok, 50), percentile(ok, 99), percentile(lags, 99)
    result = TargetResult(
        target=target,
        sessions=sessions,
        sessions_finished=finished,
        calls_ok=len(ok),
        errors=len(failed),
        cut_at_deadline=sum(1 for r in records if r.outcome == "cut"),
        error_kinds=dict(Counter(_error_kind(r) for r in failed).most_common(8)),
        p50_ms=None if p50 is None else p50 * 1000,
        p99_ms=None if p99 is None else p99 * 1000,
        calls_per_s=len(ok) / span if (span := _active_span(records)) > 0 else 0.0,
        wall_s=wall_s,
        server=server,
        engine_cpu_per_call_ms=engine_cpu_s / len(ok) * 1000 if engine_cpu_s is not None and ok else None,
        client_procs=len(clients),
        client_cpu_pct_max=max((c.cpu_s / c.wall_s * 100 for c in clients if c.wall_s > 0), default=0.0),
        client_cpu_per_call_ms=sum(c.cpu_s for c in clients) / len(ok) * 1000 if ok else None,
        client_lag_p99_ms=(lag99 or 0.0) * 1000,
        note=note,
    )
    if server is not None:
        result.rss_per_session_mb = (server.rss_end_mb - server.rss_idle_mb) / sessions if sessions else None
        result.cpu_per_call_ms = server.cpu_s / len(ok) * 1000 if ok else None
        if server.kernel_cpu_s is not None and ok:
            result.kernel_cpu_per_call_ms = server.kernel_cpu_s / len(ok) * 1000
    return result


def add_baseline(level: LevelResult) -> None:
    """Fill each target's added latency: its percentile minus the baseline's, in the same level."""
    base = next((t for t in level.targets if t.target == "baseline"), None)
    if base is None:
        return
    for t in level.targets:
        if t.target == "baseline":
            continue
        if t.p50_ms is not None and base.p50_ms is not None:
            t.p50_added_ms = t.p50_ms - base.p50_ms
        if t.p99_ms is not None and base.p99_ms is not None:
            t.p99_added_ms = t.p99_ms - base.p99_ms


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def _cell(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _cpu_cell(t: TargetResult) -> str:
    cell = _cell(t.cpu_per_call_ms, 2)
    return cell if t.kernel_cpu_per_call_ms is None else f"{cell} ({t.kernel_cpu_per_call_ms:.2f})"


def _target_note(t: TargetResult) -> str:
    parts = [t.note] if t.note else []
    if t.error_kinds:
        parts.append("errors: " + "; ".join(f"{k} ×{n}" for k, n in t.error_kinds.items()))
    if t.proxy_waits:
        parts.append(f"its own histograms: {render_waits(t.proxy_waits)}.")
    return f"- {t.target}: {' '.join(parts)}"


def render_markdown(run: RunResults) -> str:
    out = [
        "# Capture proxy load benchmark: results",
        "",
        f"Command: `{run.command}`",
        "",
        f"Started {run.started_at}, finished {run.finished_at}. Machine: {run.machine}. "
        f"Load average before the run: {run.load_before}.",
        "",
        f"harnessrl proxy config: {run.proxy_config}",
        "",
        "Columns: *finished* = sessions whose every turn succeeded; *errors* = failed calls (a session stops at "
        "its first); *cut* = calls still in flight at the level's time limit; latency = one call, request sent to "
        "last byte read (streams included); *added* = the target's percentile minus the baseline's in the same "
        "level; *RSS/session* = (server RSS with all sessions live at the end − idle RSS) / sessions; *CPU/call* "
        "= server process CPU time over the level / calls answered (in brackets, its part in the kernel: sockets, "
        "fsync, page faults); *client* = busiest load-generator process "
        "(% of one core) and its event-loop lag p99; *client CPU/call* = all load-generator processes' CPU time "
        "/ calls answered. Below a table, the harnessrl proxy's own histograms (its `/metrics`) split its time: "
        "*engine call* = request to the engine's last byte, *journal* = a record's wait until durable (the "
        "percentiles are bucket bounds).",
        "",
    ]
    for level in run.levels:
        out += [
            f"## {level.sessions:,} sessions, {level.pause_s:g} s between calls, {level.turns} turns",
            "",
            "| target | finished | errors | cut | calls/s | p50 ms | p99 ms | p50 added ms | p99 added ms "
            "| RSS/session MB | CPU/call ms (kernel) | engine CPU/call ms | client CPU % / lag p99 ms | client CPU/call ms |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for t in level.targets:
            out.append(
                f"| {t.target} | {t.sessions_finished:,}/{t.sessions:,} | {t.errors:,} | {t.cut_at_deadline:,} "
                f"| {t.calls_per_s:.0f} | {_ms(t.p50_ms)} | {_ms(t.p99_ms)} | {_ms(t.p50_added_ms)} "
                f"| {_ms(t.p99_added_ms)} | {_cell(t.rss_per_session_mb, 3)} | {_cpu_cell(t)} "
                f"| {_cell(t.engine_cpu_per_call_ms, 2)} | {t.client_cpu_pct_max:.0f} / {t.client_lag_p99_ms:.0f} "
                f"| {_cell(t.client_cpu_per_call_ms, 2)} |"
            )
        notes = [_target_note(t) for t in level.targets if t.note or t.error_kinds or t.proxy_waits]
        out += ["", *notes] if notes else []
        out.append("")
    if run.notes:
        out += ["## Notes", "", *[f"- {n}" for n in run.notes], ""]
    return "\n".join(out)
