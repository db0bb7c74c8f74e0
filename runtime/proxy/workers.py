"""Worker processes of one proxy replica (`ProxyConfig.workers` > 1).

One event loop serves about one core's worth of calls (~2 ms of CPU per captured call on the benchmark machine),
so a replica with W workers runs W `harnessrl proxy --worker K` processes under a small supervisor that restarts
any that exits. Worker K is a whole proxy for the sessions it creates:
- its own port, `port + 1 + K`, in the base URL `POST /sessions` answers with (so a session's harness traffic
  goes straight to the worker that owns it, as it goes to the replica that owns it);
- its own journal file and replica id, `<replica_id>-w<K>` (rebuilt by the same worker index after a restart);
- and, with every other worker, the replica's port, bound with SO_REUSEPORT: the kernel spreads the connections
  that reach the replica's URL (`POST /sessions` through the Service, probes) over the live workers.
Replica-wide admin writes (`PUT /policy`, pause/resume, engine drain) that reach one worker are applied there and
forwarded to the others (`forward`), so a caller still sees one replica; a worker that cannot be reached fails
the write with 502, naming it, and the caller retries (each write is idempotent).
The supervisor restarts a worker that exits, and kills (then restarts) one whose event loop stops beating
(`Heartbeat`, `WorkerHealth`): Kubernetes' probes reach the shared port, so they cannot single out a hung worker.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from harnessrl.runtime.contracts.proxy_config import ProxyConfig, worker_port, worker_ports
from harnessrl.runtime.programs import python_module

log = logging.getLogger("harnessrl.proxy.workers")

FORWARDED_HEADER = "x-harnessrl-forwarded"  # set on a forwarded write, so its receiver does not forward it again
QUICK_EXIT_S = 5.0  # a worker that exits sooner than this after its start has failed to start
QUICK_EXITS_ALLOWED = 5  # in a row, per worker, before the supervisor gives up (bad config, port taken)
STOP_GRACE_S = 10.0


def proxy_ports(config: ProxyConfig) -> frozenset[int]:
    """Every port this proxy serves at, where a call may be relayed to (relay.py): the replica's port and its
    workers' own (the same on every replica), and `relay_ports` (replicas that serve at other ports)."""
    return frozenset((config.port, *worker_ports(config.port, config.workers), *config.relay_ports))


def worker_command(proxy_args: list[str], index: int, heartbeat_fd: int) -> list[str]:
    """Worker `index` of a replica started with `harnessrl proxy` arguments `proxy_args`."""
    return python_module("harnessrl.runtime.proxy.main", *proxy_args, "--worker", str(index),
                         "--heartbeat-fd", str(heartbeat_fd))


def worker_config(config: ProxyConfig, index: int) -> ProxyConfig:
    """What worker `index` serves as: its own port in its public URL, its own replica id (and journal file)."""
    port = worker_port(config.port, index)
    update: dict[str, object] = {"port": port, "replica_id": f"{config.replica_id}-w{index}", "workers": 1}
    if config.public_base_url is not None:
        parts = urlsplit(str(config.public_base_url))
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        update["public_base_url"] = urlunsplit(parts._replace(netloc=f"{host}:{port}"))
    return ProxyConfig.model_validate({**config.model_dump(), **update})


class Heartbeat:
    """A worker's sign of life: a byte to the supervisor's pipe every `interval_s`, written by a timer on the
    worker's event loop (see `WorkerHealth`)."""

    def __init__(self, fd: int, interval_s: float) -> None:
        self.fd, self.interval_s = fd, interval_s
        self._timer: asyncio.TimerHandle | None = None
        os.set_blocking(fd, False)

    def start(self) -> None:
        self._beat()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _beat(self) -> None:
        try:
            os.write(self.fd, b".")
        except BlockingIOError:  # the pipe is full of beats the supervisor has not read yet: it is alive
            pass
        except OSError:  # the supervisor is gone; the worker dies with it (PR_SET_PDEATHSIG)
            return
        self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._beat)


@dataclass(frozen=True)
class WorkerRole:
    """Which worker of its replica an app is (`name`, the `worker` label of its metrics), where the other
    workers are (name -> loopback URL), the ports of the whole proxy (`proxy_ports` of the replica's config: a
    worker's own config names only its port), and its heartbeat to the supervisor (started once it serves)."""

    name: str
    siblings: dict[str, str]
    ports: frozenset[int]
    heartbeat: Heartbeat | None = None


def worker_role(config: ProxyConfig, index: int, heartbeat_fd: int | None = None) -> WorkerRole:
    return WorkerRole(
        name=f"w{index}",
        siblings={f"w{k}": f"http://{config.local_host()}:{worker_port(config.port, k)}"
                  for k in range(config.workers) if k != index},
        ports=proxy_ports(config),
        heartbeat=None if heartbeat_fd is None else Heartbeat(heartbeat_fd, config.worker_health.interval_s),
    )


def listen_sockets(config: ProxyConfig, index: int) -> list[socket.socket]:
    """The replica's port (shared with the other workers) and worker `index`'s own."""
    replica = bind_socket(config.host, config.port, shared=True)
    try:
        return [replica, bind_socket(config.host, worker_port(config.port, index), shared=False)]
    except OSError:
        replica.close()
        raise


def bind_socket(host: str, port: int, *, shared: bool) -> socket.socket:
    """A bound TCP socket; `shared`: other processes bind the same port too (SO_REUSEPORT), the kernel spreads
    the connections over them."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"{host}:{port}: {exc.strerror}") from exc
    return sock


@dataclass(frozen=True)
class Forwarded:
    """The other workers' answers to one forwarded write (`failures` names each worker that did not take it)."""

    bodies: list[dict[str, Any]]
    failures: list[str]

    def total(self, key: str) -> int:
        """A count summed over the workers that answered (say, their calls in flight)."""
        return sum(int(body[key]) for body in self.bodies)


async def forward(
    siblings: dict[str, str], method: str, path_qs: str, body: bytes, authorization: str, timeout_s: float
) -> Forwarded:
    """Send one admin write to every sibling worker at once."""
    headers = {"authorization": authorization, "content-type": "application/json", FORWARDED_HEADER: "1"}
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0)) as client:
        outcomes = await asyncio.gather(
            *(client.request(method, url + path_qs, content=body, headers=headers) for url in siblings.values()),
            return_exceptions=True,
        )
    forwarded = Forwarded([], [])
    for url, outcome in zip(siblings.values(), outcomes, strict=True):
        if isinstance(outcome, httpx.Response) and outcome.status_code == 200:
            forwarded.bodies.append(outcome.json())
        elif isinstance(outcome, httpx.Response):
            forwarded.failures.append(f"{url}: {outcome.status_code} {outcome.text[:300]}")
        else:
            forwarded.failures.append(f"{url}: {type(outcome).__name__}: {outcome}")
    return forwarded


async def sibling_metrics(siblings: dict[str, str], timeout_s: float = 10.0) -> dict[str, str]:
    """Each answering sibling's own `/metrics` text, by worker name (one that is down, say restarting, is left
    out: a scrape shows the workers that are up)."""
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        outcomes = await asyncio.gather(
            *(client.get(f"{url}/metrics", headers={FORWARDED_HEADER: "1"}) for url in siblings.values()),
            return_exceptions=True,
        )
    return {
        name: outcome.text
        for name, outcome in zip(siblings, outcomes, strict=True)
        if isinstance(outcome, httpx.Response) and outcome.status_code == 200
    }


# --------------------------------------------------------------------------------------------- the supervisor


def die_with_parent() -> None:
    """In the child, before exec: a SIGKILLed supervisor takes its workers with it (Linux prctl)."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass
class HealthTracker:
    """Intervals without a heartbeat in a row, per worker process (by pid). A process that has beaten counts as
    hung after `failures_allowed` silent intervals in a row; one that has never beaten (a starting worker replays
    its journal before it serves), once it is older than `startup_timeout_s`."""

    failures_allowed: int
    startup_timeout_s: float
    answered: set[int] = field(default_factory=set)
    missed: dict[int, int] = field(default_factory=dict)

    def observe(self, pid: int, ok: bool) -> None:
        if ok:
            self.answered.add(pid)
            self.missed[pid] = 0
        elif pid in self.answered:
            self.missed[pid] = self.missed.get(pid, 0) + 1

    def hung(self, pid: int, age_s: float) -> bool:
        if pid not in self.answered:
            return age_s > self.startup_timeout_s
        return self.missed.get(pid, 0) >= self.failures_allowed

    def forget(self, pid: int) -> None:
        self.answered.discard(pid)
        self.missed.pop(pid, None)


class Supervisor:
    """Runs the workers, restarts one that exits or hangs (`WorkerHealth`), and stops them all on SIGTERM/SIGINT."""

    def __init__(self, config: ProxyConfig, worker_argv: list[str]) -> None:
        self.config = config
        self.worker_argv = worker_argv  # `harnessrl proxy` arguments; `--worker K` is appended per worker
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.beats: dict[int, int] = {}  # the read end of each worker's heartbeat pipe
        self.started_at: dict[int, float] = {}
        self.quick_exits: dict[int, int] = {}
        self.health = HealthTracker(config.worker_health.failures_allowed, config.worker_health.startup_timeout_s)
        self.stopping = False

    def start(self, index: int) -> None:
        if index in self.beats:
            os.close(self.beats.pop(index))
        beats, beat = os.pipe()
        os.set_blocking(beats, False)
        try:
            self.procs[index] = subprocess.Popen(worker_command(self.worker_argv, index, beat),
                                                 preexec_fn=die_with_parent, pass_fds=(beat,))
        finally:
            os.close(beat)
        self.beats[index] = beats
        self.started_at[index] = time.monotonic()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        for index in range(self.config.workers):
            self.start(index)
        own = worker_ports(self.config.port, self.config.workers)
        log.info("proxy %s: %d workers on port %d (own ports %d-%d)", self.config.replica_id, self.config.workers,
                 self.config.port, own[0], own[-1])
        code = 0
        next_check = time.monotonic() + self.config.worker_health.interval_s
        while not self.stopping:
            if time.monotonic() >= next_check:
                next_check += self.config.worker_health.interval_s
                self._check_beats()
            for index, proc in list(self.procs.items()):
                rc = proc.poll()
                if rc is None:
                    self._kill_if_hung(index, proc)
                    continue
                self.health.forget(proc.pid)
                quick = time.monotonic() - self.started_at[index] < QUICK_EXIT_S
                self.quick_exits[index] = self.quick_exits.get(index, 0) + 1 if quick else 0
                if self.quick_exits[index] >= QUICK_EXITS_ALLOWED:
                    log.error("proxy worker %d exited with %s %d times in a row right after starting; stopping",
                              index, rc, self.quick_exits[index])
                    self.stopping, code = True, rc or 1
                    break
                log.warning("proxy worker %d exited with %s; restarting it (it rebuilds from its journal)", index, rc)
                time.sleep(1.0 if quick else 0.0)
                self.start(index)
            time.sleep(0.1)
        self._stop_all()
        return code

    def _check_beats(self) -> None:
        """Did each worker beat since the last check (bytes waiting in its pipe)?"""
        for index, proc in self.procs.items():
            try:
                beat = bool(os.read(self.beats[index], 4096))
            except BlockingIOError:
                beat = False
            self.health.observe(proc.pid, beat)

    def _kill_if_hung(self, index: int, proc: subprocess.Popen[bytes]) -> None:
        if not self.health.hung(proc.pid, time.monotonic() - self.started_at[index]):
            return
        health = self.config.worker_health
        if proc.pid in self.health.answered:
            log.warning("proxy worker %d (pid %d) has not beaten for %d intervals of %g s in a row (its event loop "
                        "is stuck); killing it, it restarts from its journal", index, proc.pid,
                        health.failures_allowed, health.interval_s)
        else:
            log.warning("proxy worker %d (pid %d) has not beaten %g s after its start (stuck replaying its "
                        "journal?); killing it, it restarts", index, proc.pid, health.startup_timeout_s)
        self.health.forget(proc.pid)
        proc.kill()

    def _stop(self, signum: int, _frame: object) -> None:
        self.stopping = True

    def _stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for beats in self.beats.values():
            os.close(beats)


def supervise(config: ProxyConfig, config_path: Path, port: int | None) -> int:
    argv = ["--config", str(config_path), *(["--port", str(port)] if port is not None else [])]
    return Supervisor(config, argv).run()
