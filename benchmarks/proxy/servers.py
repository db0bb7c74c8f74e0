"""The processes the benchmark runs on loopback: the engine stand-in, harnessrl's proxy, the reference proxy.

Each is a subprocess on a free 127.0.0.1 port, logged to a file in the run's temp directory, measured with psutil
by its PID, and stopped by its PID (SIGTERM, then SIGKILL). `ProcessGroup` stops everything it started, also
when the run is interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psutil
import yaml
from harnessrl.runtime.contracts.proxy_config import worker_ports
from harnessrl.runtime.ports import free_ports
from results import ProcessUsage

REPO = Path(__file__).resolve().parents[2]


class Server:
    """One started process, reachable at `url`."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        port: int,
        log_dir: Path,
        env: dict[str, str] | None = None,
        ready_path: str = "/health",
    ) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=log_dir,  # not the repo root: its operator/ would shadow the stdlib module under `python -m`
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self.ps = psutil.Process(self.proc.pid)
        self.ready_urls = [self.url + ready_path]  # all must answer 200

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log:\n{self.log_tail()}")
            try:
                if all(httpx.get(url, timeout=2.0).status_code == 200 for url in self.ready_urls):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout_s:.0f}s; log:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def processes(self) -> list[psutil.Process]:
        """The server and its live child processes (a proxy replica's workers)."""
        return [self.ps, *self.ps.children(recursive=True)]

    def rss_mb(self) -> float:
        return sum(_rss(p) for p in self.processes()) / (1 << 20)

    def cpu_s(self, kernel: bool = False) -> float:
        """Its CPU time (its workers' included), or only the part spent in the kernel (`kernel`)."""
        return sum(_cpu_s(p, kernel) for p in self.processes())

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        self._log.close()


def _rss(process: psutil.Process) -> float:
    with contextlib.suppress(psutil.NoSuchProcess):
        return float(process.memory_info().rss)
    return 0.0


def _cpu_s(process: psutil.Process, kernel: bool) -> float:
    """Its CPU time, and that of its children it has waited for; only the system time with `kernel`."""
    with contextlib.suppress(psutil.NoSuchProcess):
        times = process.cpu_times()
        system = times.system + times.children_system
        return float(system if kernel else times.user + times.children_user + system)
    return 0.0


class ProcessGroup:
    """Every server the run started; `stop_all` stops each by PID (safe to call twice)."""

    def __init__(self) -> None:
        self.servers: list[Server] = []
        self.started: list[str] = []  # "name pid N", for the results

    def add(self, server: Server) -> Server:
        self.servers.append(server)
        self.started.append(f"{server.name} pid {server.pid}")
        return server

    def ready(self, server: Server, timeout_s: float) -> Server:
        """Wait until `server` answers; stop it if it does not."""
        try:
            server.wait_ready(timeout_s)
        except BaseException:
            self.stop(server)
            raise
        return server

    def stop(self, server: Server) -> None:
        server.stop()
        if server in self.servers:
            self.servers.remove(server)

    def stop_all(self) -> None:
        for server in reversed(self.servers):
            try:
                server.stop()
            except Exception as exc:  # keep stopping the others
                print(f"stopping {server.name} (pid {server.pid}) failed: {exc}", file=sys.stderr)
        self.servers.clear()


class UsageSampler:
    """Samples a server's RSS while a level runs (for the peak), on a thread so the client is not involved."""

    def __init__(self, server: Server, rss_idle_mb: float, period_s: float = 0.5) -> None:
        self.server = server
        self.period_s = period_s
        self.rss_idle_mb = rss_idle_mb
        self.cpu0 = server.cpu_s()
        self.kernel_cpu0 = server.cpu_s(kernel=True)
        self.peak_mb = server.rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.peak_mb = max(self.peak_mb, self.server.rss_mb())
            except psutil.Error:
                return

    def start(self) -> UsageSampler:
        self._thread.start()
        return self

    def finish(self) -> ProcessUsage:
        self._stop.set()
        self._thread.join(5)
        end = self.server.rss_mb()
        return ProcessUsage(
            rss_idle_mb=self.rss_idle_mb,
            rss_end_mb=end,
            rss_peak_mb=max(self.peak_mb, end),
            cpu_s=self.server.cpu_s() - self.cpu0,
            kernel_cpu_s=self.server.cpu_s(kernel=True) - self.kernel_cpu0,
        )


# --------------------------------------------------------------------------------------------- the three kinds


def start_engine(group: ProcessGroup, work_dir: Path, script: dict[str, Any], model: str) -> Server:
    """The scripted vLLM stand-in in its fast mode (byte-stride tokenizer, no call recording)."""
    script_path = work_dir / "engine-script.json"
    script_path.write_text(json.dumps(script))
    port = free_ports()
    # `python -m tests.fakes.scripted_engine` with the repo root appended to sys.path, not prepended as
    # PYTHONPATH would: the root's operator/ folder would shadow the standard library's.
    argv = [
        sys.executable,
        "-P",
        "-c",
        "import runpy, sys; sys.path.append(sys.argv.pop(1)); "
        "runpy.run_module('tests.fakes.scripted_engine', run_name='__main__', alter_sys=True)",
        str(REPO),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tokenizer",
        "fast",
        "--model",
        model,
        "--script",
        str(script_path),
    ]
    server = group.ready(group.add(Server("engine", argv, port, work_dir, ready_path="/health")), 120)
    return server


def start_harnessrl(
    group: ProcessGroup, work_dir: Path, engine_url: str, model: str, extra_config: dict[str, Any],
    wrapper: Sequence[str] = (),
) -> tuple[Server, str]:
    """`harnessrl proxy --config FILE` with a fresh journal directory and admin token file; with `workers` in
    `extra_config`, ready once every worker serves at its own port. `wrapper`: a command it runs under (say,
    valgrind's)."""
    workers = int(extra_config.get("workers", 1))
    port = free_ports(1 + workers)
    token = secrets.token_urlsafe(24)
    run_dir = work_dir / f"harnessrl-{port}"
    run_dir.mkdir()
    (run_dir / "admin-token").write_text(token)
    config = {
        "host": "127.0.0.1",
        "port": port,
        "upstream_urls": [engine_url],
        "served_model": model,
        "admin_token_file": str(run_dir / "admin-token"),
        "journal_dir": str(run_dir / "journal"),
        "log_level": "warning",
        **extra_config,
    }
    (run_dir / "proxy.yaml").write_text(yaml.safe_dump(config))
    harnessrl = Path(sys.executable).parent / "harnessrl"
    argv = [*wrapper, str(harnessrl), "proxy", "--config", str(run_dir / "proxy.yaml")]
    server = group.add(Server("harnessrl", argv, port, work_dir, ready_path="/healthz"))
    # The replica's port answers once any one worker is up: wait for each worker's own port too.
    server.ready_urls += [f"http://127.0.0.1:{p}/healthz" for p in worker_ports(port, workers)]
    return group.ready(server, 120), token


def start_forwarder(
    group: ProcessGroup, work_dir: Path, engine_url: str, processes: int = 1, wrapper: Sequence[str] = ()
) -> Server:
    """The do-nothing forwarder (forwarder.py): the proxy's HTTP stack relaying calls to the engine unparsed, in
    `processes` processes sharing one port."""
    port = free_ports()
    argv = [*wrapper, sys.executable, str(Path(__file__).resolve().parent / "forwarder.py"), str(port), engine_url,
            str(processes)]
    return group.ready(group.add(Server("forwarder", argv, port, work_dir, ready_path="/health")), 60)


def start_openenv(
    group: ProcessGroup, work_dir: Path, engine_url: str, model: str, python: Path
) -> tuple[Server, str]:
    """The reference capture server, started as its module's docs say (`--llm-url`, `--model`; the capture level
    is probed from the engine), on loopback, with an admin key from the environment (never on the command line)."""
    port = free_ports()
    token = secrets.token_urlsafe(24)
    argv = [
        str(python),
        "-m",
        "openenv.core.harness.capture.server",
        "--llm-url",
        engine_url,
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    env = {"OPENENV_CAPTURE_ADMIN_KEY": token}
    server = group.ready(
        group.add(Server("openenv", argv, port, work_dir, env=env, ready_path="/health")), 180
    )
    return server, token


# --------------------------------------------------------------------------------------------- sessions


async def _create_sessions(
    url: str, token: str, bodies: list[dict[str, Any]], parallel: int = 32
) -> list[tuple[str, str]]:
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    limit = asyncio.Semaphore(parallel)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def one(body: dict[str, Any]) -> tuple[str, str]:
            async with limit, http.post(f"{url}/sessions", data=json.dumps(body), headers=headers) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise RuntimeError(f"POST {url}/sessions -> {resp.status}: {text[:300]}")
                created = json.loads(text)
                return str(created["session_id"]), str(created.get("base_url") or url)

        return list(await asyncio.gather(*(one(b) for b in bodies)))


def create_sessions(target: str, url: str, token: str, count: int, level_tag: str) -> list[tuple[str, str]]:
    """Create `count` sessions through the admin API, as a runner would before starting each harness: each one's
    id and the base URL its harness must use (harnessrl: the worker that owns it)."""
    if target == "harnessrl":
        bodies: list[dict[str, Any]] = [
            {
                "rollout_id": f"{level_tag}-r{i}",
                "task_id": f"task-{i % 50}",
                "harness": f"bench-{i % 4}",
                "group_id": f"{level_tag}-g{i // 8}",
                "metadata": {"bench": level_tag},
            }
            for i in range(count)
        ]
    else:
        bodies = [{"metadata": {"bench": level_tag, "rollout": f"r{i}"}} for i in range(count)]
    return asyncio.run(_create_sessions(url, token, bodies))
