"""A proxy replica of several worker processes (`ProxyConfig.workers`): one real `harnessrl proxy` (its supervisor
and two `--worker K` processes) on 127.0.0.1 in front of the scripted engine, which speaks vLLM's HTTP API.

Sessions created at the replica's port land on either worker (the kernel spreads connections over SO_REUSEPORT
listeners) and are served at that worker's own port (a call that reaches the other worker is relayed to it);
replica-wide admin writes reach every worker; a SIGKILLed
worker is restarted by the supervisor and rebuilds its sessions from its own journal; stopping the supervisor
stops every worker."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
import yaml
from harnessrl.runtime.proxy.allocator import installable, mapped
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.proxy_server import ProxyFactory, ProxyProcess
from tests.integration.proxy_helpers import BY_NAME, send
from tests.ports import free_ports

pytestmark = pytest.mark.timeout(120)

CHAT = BY_NAME["openai_chat"]


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from tests.fakes.scripted_engine import (
        ScriptedEngine,
        ScriptedEngineServer,
        ScriptedReply,
        make_tokenizer,
    )

    server = ScriptedEngineServer(ScriptedEngine(make_tokenizer("bytes"))).start()
    server.set_script([ScriptedReply(content="Done.")])
    yield server
    server.stop()


def _workers(proxy: ProxyProcess) -> dict[int, psutil.Process]:
    """The supervisor's worker processes by index (their command lines have `--worker K`)."""
    assert proxy.proc is not None
    workers = {}
    for child in psutil.Process(proxy.proc.pid).children():
        try:
            cmdline = child.cmdline()
        except (psutil.ZombieProcess, psutil.NoSuchProcess):  # killed, not yet reaped by the supervisor
            continue
        if "--worker" in cmdline:
            workers[int(cmdline[cmdline.index("--worker") + 1])] = child
    return workers


def _create_sessions(proxy: ProxyProcess, count: int) -> list[dict[str, Any]]:
    """`POST /sessions` at the replica's port from one keep-alive client, as a runner does. The kernel picks a
    worker per connection, and each answer closes its connection, so the sessions still spread."""
    body = {"rollout_id": "r", "task_id": "t", "harness": "h", "group_id": "g"}
    with httpx.Client(timeout=10) as client:
        responses = [client.post(f"{proxy.url}/sessions", headers=proxy.admin_headers, json=body)
                     for _ in range(count)]
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    assert all(r.headers["connection"] == "close" for r in responses)
    return [dict(r.json()) for r in responses]


def _chat(base_url: str, sid: str) -> httpx.Response:
    return send(base_url, CHAT, sid, CHAT.body("Fix the bug."))


def test_sessions_live_on_the_worker_that_created_them_and_admin_writes_reach_every_worker(
    proxy_factory: ProxyFactory, engine: Any
) -> None:
    proxy = proxy_factory([engine.root_url], workers=2)
    workers = proxy.worker_urls
    sessions = _create_sessions(proxy, 24)

    # Each session is answered with one worker's own URL (and replica id); 24 connections reach both workers.
    owners = {s["base_url"] for s in sessions}
    assert owners == set(workers), owners
    assert {s["replica_id"] for s in sessions} == {"proxy-0-w0", "proxy-0-w1"}
    for s in sessions[:6]:
        assert s["session_id"].endswith("." + urlsplit(s["base_url"]).netloc)  # the id names its owner
        assert _chat(s["base_url"], s["session_id"]).status_code == 200
        # The other worker does not hold it: it relays the call to the one that does (relay.py).
        other = next(u for u in workers if u != s["base_url"])
        assert _chat(other, s["session_id"]).status_code == 200
        info = httpx.get(f"{s['base_url']}/sessions/{s['session_id']}", headers=proxy.admin_headers, timeout=10)
        assert (info.json()["calls"], info.json()["turns"]) == (2, 2)  # both calls captured by the owner
    # A key no worker made is refused wherever it lands: the owner it names does not hold it, or it names none.
    assert _chat(workers[1], "x" * 32 + "." + urlsplit(workers[0]).netloc).status_code == 401
    assert _chat(workers[0], "no-such-session").status_code == 401

    # A scrape of the replica's port shows every worker's series, labelled by worker: 12 answered by their owner,
    # 7 relayed to it, 2 refused.
    scraped = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    requests = {(s.labels["worker"], s.labels["outcome"]): s.value
                for family in text_string_to_metric_families(scraped) if family.name == "harnessrl_proxy_requests"
                for s in family.samples if s.name == "harnessrl_proxy_requests_total"}
    assert {worker for worker, _ in requests} == {"w0", "w1"}
    assert sum(v for (_, outcome), v in requests.items() if outcome == "ok") == 12
    assert sum(v for (_, outcome), v in requests.items() if outcome == "relayed") == 7
    assert sum(v for (_, outcome), v in requests.items() if outcome == "unauthorized") == 2

    # Replica-wide writes sent to the replica's port reach both workers.
    policy = {"model": "tiny", "version": 3}  # a new version of a model the engine serves
    assert httpx.put(f"{proxy.url}/policy", json=policy, headers=proxy.admin_headers, timeout=30).json() == policy
    assert [httpx.get(f"{u}/policy", timeout=10).json() for u in workers] == [policy, policy]
    drain = httpx.post(f"{proxy.url}/engines/drain", json={"url": engine.root_url, "draining": True},
                       headers=proxy.admin_headers, timeout=30)
    assert drain.status_code == 200, drain.text
    engines = [httpx.get(f"{u}/engines", headers=proxy.admin_headers, timeout=10).json() for u in workers]
    assert [e[0]["draining"] for e in engines] == [True, True]
    httpx.post(f"{proxy.url}/engines/drain", json={"url": engine.root_url, "draining": False},
               headers=proxy.admin_headers, timeout=30).raise_for_status()

    # Paused, a call on either worker waits (no error) until the replica resumes.
    paused = httpx.post(f"{proxy.url}/admin/pause?timeout_s=5", headers=proxy.admin_headers, timeout=30)
    assert paused.json() == {"paused": True, "inflight": 0}
    one_per_worker = [next(s for s in sessions if s["base_url"] == u) for u in workers]
    answers: list[int] = []
    calls = [threading.Thread(target=lambda s=s: answers.append(_chat(s["base_url"], s["session_id"]).status_code))
             for s in one_per_worker]
    for t in calls:
        t.start()
    time.sleep(1.0)
    assert answers == []
    httpx.post(f"{proxy.url}/admin/resume", headers=proxy.admin_headers, timeout=30).raise_for_status()
    for t in calls:
        t.join(timeout=30)
    assert answers == [200, 200], answers


def test_a_killed_worker_is_restarted_with_its_sessions_and_stopping_the_replica_stops_every_worker(
    proxy_factory: ProxyFactory, engine: Any
) -> None:
    proxy = proxy_factory([engine.root_url], workers=2)
    victim_url, mine = _served_sessions_of(proxy, 1, 24)
    before = _turns(proxy, victim_url, mine)
    old = _workers(proxy)
    old[1].send_signal(signal.SIGKILL)
    old[1].wait(timeout=10)
    _wait_restarted(proxy, 1, old[1].pid)
    now = _workers(proxy)
    assert now[0].pid == old[0].pid
    assert _turns(proxy, victim_url, mine) == before
    assert _chat(victim_url, mine[0]).status_code == 200

    assert proxy.proc is not None
    proxy.stop()
    assert proxy.proc.returncode == 0
    for process in now.values():
        with pytest.raises(psutil.NoSuchProcess):
            process.wait(timeout=10)
            process.status()


def test_a_hung_worker_is_killed_and_restarted_with_its_sessions(proxy_factory: ProxyFactory, engine: Any) -> None:
    """SIGSTOP: the worker's process lives on but its event loop runs nothing, as a deadlocked one would. Its port
    still accepts connections (the kernel queues them); its heartbeat stops."""
    health = {"interval_s": 0.3, "failures_allowed": 3}
    proxy = proxy_factory([engine.root_url], workers=2, worker_health=health)
    victim_url, mine = _served_sessions_of(proxy, 1, 16)
    before = _turns(proxy, victim_url, mine)
    old = _workers(proxy)
    old[1].suspend()
    _wait_restarted(proxy, 1, old[1].pid)
    with pytest.raises(psutil.NoSuchProcess):  # killed, not left stopped beside its successor
        old[1].wait(timeout=10)
        old[1].status()
    assert _workers(proxy)[0].pid == old[0].pid
    assert _turns(proxy, victim_url, mine) == before
    assert _chat(victim_url, mine[0]).status_code == 200
    assert f"proxy worker 1 (pid {old[1].pid}) has not beaten for 3 intervals of 0.3 s in a row" in proxy.log_text()


def test_a_worker_stuck_in_its_start_is_killed_and_restarted(proxy_factory: ProxyFactory, engine: Any) -> None:
    """A worker that never answers after a restart (SIGSTOPped while it starts: as one stuck replaying its
    journal) is killed once `startup_timeout_s` has passed, and its successor serves its sessions."""
    health = {"interval_s": 0.3, "failures_allowed": 3, "startup_timeout_s": 4.0}
    proxy = proxy_factory([engine.root_url], workers=2, worker_health=health)
    victim_url, mine = _served_sessions_of(proxy, 1, 16)
    before = _turns(proxy, victim_url, mine)
    old = _workers(proxy)[1]
    old.kill()
    deadline = time.monotonic() + 30
    while (starting := _workers(proxy).get(1)) is None or starting.pid == old.pid:
        assert time.monotonic() < deadline, proxy.log_text()
        time.sleep(0.01)
    starting.suspend()  # before it has imported its modules, let alone replayed its journal
    _wait_restarted(proxy, 1, starting.pid)
    assert f"proxy worker 1 (pid {starting.pid}) has not beaten 4 s after its start" in proxy.log_text()
    assert _turns(proxy, victim_url, mine) == before
    assert _chat(victim_url, mine[0]).status_code == 200


def _served_sessions_of(proxy: ProxyProcess, index: int, count: int) -> tuple[str, list[str]]:
    """Create `count` sessions at the replica's port, one call each; worker `index`'s URL and its sessions' ids."""
    sessions = _create_sessions(proxy, count)
    for s in sessions:
        assert _chat(s["base_url"], s["session_id"]).status_code == 200
    url = proxy.worker_urls[index]
    mine = [s["session_id"] for s in sessions if s["base_url"] == url]
    assert mine
    return url, mine


def _turns(proxy: ProxyProcess, worker_url: str, sids: list[str]) -> dict[str, bytes]:
    """The captured call graph of each session, as served."""
    return {sid: httpx.get(f"{worker_url}/sessions/{sid}/turns", headers=proxy.admin_headers, timeout=10).content
            for sid in sids}


def _wait_restarted(proxy: ProxyProcess, index: int, old_pid: int) -> None:
    """Until worker `index` is a new process that answers at its own port (it rebuilds from its journal first)."""
    deadline = time.monotonic() + 60
    while True:
        worker = _workers(proxy).get(index)
        try:
            if worker is not None and worker.pid != old_pid and httpx.get(
                    f"{proxy.worker_urls[index]}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, proxy.log_text()
        time.sleep(0.2)


def test_a_worker_that_cannot_start_stops_the_replica_with_the_reason(tmp_path: Path) -> None:
    first = free_ports(3)
    token = tmp_path / "token"
    token.write_text("t")
    config = tmp_path / "proxy.yaml"
    config.write_text(yaml.safe_dump({
        "host": "127.0.0.1", "port": first, "workers": 2, "upstream_urls": ["http://127.0.0.1:9"],
        "served_model": "tiny", "admin_token_file": str(token), "journal_dir": str(tmp_path / "journal"),
    }))
    with socket.socket() as taken:  # worker 1's own port is in use
        taken.bind(("127.0.0.1", first + 2))
        taken.listen()
        harnessrl = Path(sys.executable).parent / "harnessrl"
        done = subprocess.run([str(harnessrl), "proxy", "--config", str(config)], capture_output=True, text=True,
                              timeout=90)
    assert done.returncode != 0
    assert f"worker 1 cannot listen: [Errno 98] 127.0.0.1:{first + 2}: Address already in use" in done.stderr
    assert "proxy worker 1 exited with 2 5 times in a row right after starting; stopping" in done.stderr


def _allocator_of(process: psutil.Process) -> tuple[bool, str | None]:
    """Whether mimalloc is mapped into a process, and the PYTHONMALLOC it runs with."""
    return mapped(Path(f"/proc/{process.pid}/maps").read_text()), process.environ().get("PYTHONMALLOC")


@pytest.mark.skipif(not installable(), reason="reads /proc; cmeel-mimalloc ships wheels for Linux on x86_64 and aarch64")
def test_a_replica_runs_on_mimalloc_in_every_process_and_the_system_allocator_when_configured(
    proxy_factory: ProxyFactory, engine: Any
) -> None:
    """`harnessrl proxy` re-executes itself with mimalloc preloaded (allocator.py): the supervisor keeps the PID
    it was started with, its workers inherit the allocator, and they serve calls on it."""
    proxy = proxy_factory([engine.root_url], workers=2)
    assert proxy.proc is not None
    supervisor = psutil.Process(proxy.proc.pid)  # the PID Popen started: the re-executed process is the same one
    workers = _workers(proxy)
    assert sorted(workers) == [0, 1]
    for process in [supervisor, *workers.values()]:
        assert _allocator_of(process) == (True, "malloc"), process.cmdline()
    session = _create_sessions(proxy, 1)[0]
    assert _chat(session["base_url"], session["session_id"]).status_code == 200

    plain = proxy_factory([engine.root_url], allocator="system")
    assert plain.proc is not None
    assert _allocator_of(psutil.Process(plain.proc.pid)) == (False, None)
