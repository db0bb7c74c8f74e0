"""Every server's request heads are bounded in size and time (runtime/serving.py), attacked over real sockets on
127.0.0.1 against a real `harnessrl proxy` process (the other programs build their servers the same way).

- Unfinished request heads (128 MB of headers on each of four connections) are cut at the head limit with 431,
  and the proxy's peak memory stays flat (its peak went from 65 to 195 MB before).
- Slow heads (slowloris: 200 connections, half sending nothing, half a header byte now and then) are all closed
  once their head takes longer than the head timeout (before, all 200 were held), and the proxy still serves.
Memory is the process's peak RSS (VmHWM in /proc/PID/status): growth there is what the attack cost.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from harnessrl.runtime.coordinator.ledger import PoolHarness
from harnessrl.runtime.evaluation.config import EvalConfig
from harnessrl.runtime.evaluation.coordinator import EvalCoordinator, create_app

from tests.fixtures.proxy_server import ProxyFactory, serve_in_thread
from tests.fixtures.raw_http import MB, answer_head, peak_rss_mb, send_until_refused
from tests.fixtures.runner_token import RUNNER_AUTH, runner_token_file
from tests.ports import free_port, wait_serving

pytestmark = pytest.mark.timeout(180)
TASKS = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "tasks" / "test"


@pytest.fixture
def proxy(proxy_factory: ProxyFactory, scripted_engine_factory: Callable[..., Any]) -> Any:
    engine = scripted_engine_factory(tokenizer="bytes")
    return proxy_factory([engine.root_url], http={"head_timeout_s": 2.0}, allocator="system")


def test_unfinished_headers_are_cut_at_the_head_limit_and_cost_the_proxy_no_memory(proxy: Any) -> None:
    pid = proxy.proc.pid
    before = peak_rss_mb(pid)
    line = b"x-pad: " + b"a" * 8000 + b"\r\n"
    answers, sent = [], 0
    for _ in range(4):
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            sent += send_until_refused(sock, 128 * MB, line)
            answers.append(answer_head(sock, 10.0))
    after = peak_rss_mb(pid)
    assert after - before < 30, f"peak RSS {before:.0f} -> {after:.0f} MB after {sent / MB:.0f} MB of headers"
    assert all(a.startswith(b"HTTP/1.1 431") for a in answers), [a[:100] for a in answers]
    assert sent < 4 * 16 * MB  # each connection was cut near the limit, not after its 128 MB
    assert httpx.get(f"{proxy.url}/healthz", timeout=10).status_code == 200


def test_slow_heads_are_closed_after_the_head_timeout(proxy: Any) -> None:
    conns = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(200)]
    try:
        # Half send nothing at all, half start a head and then trickle a header byte at a time.
        for sock in conns[1::2]:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: ")
        closed: set[int] = set()
        deadline = time.monotonic() + 15
        while len(closed) < len(conns) and time.monotonic() < deadline:
            for i, sock in enumerate(conns):
                if i in closed:
                    continue
                try:
                    if i % 2:
                        sock.sendall(b"x")
                    sock.settimeout(0.001)
                    if sock.recv(4096) == b"":
                        closed.add(i)
                except TimeoutError:
                    pass
                except OSError:  # reset, or the pipe is broken: closed by the server
                    closed.add(i)
            time.sleep(0.2)
        assert len(closed) == len(conns), f"{len(conns) - len(closed)} slow connections still held"
        assert time.monotonic() < deadline
    finally:
        for sock in conns:
            sock.close()
    # An honest caller's connection that sends its head at once is served as always.
    assert httpx.get(f"{proxy.url}/healthz", timeout=10).status_code == 200


def test_the_runner_serves_metrics_beside_its_loop_and_still_stops_on_sigterm(tmp_path: Path) -> None:
    """The runner's /metrics is built like every other server (it was prometheus_client's thread-per-connection
    server with no limits), on a thread beside the runner's loop, which keeps its own SIGTERM handling."""
    config = EvalConfig(label="base", pools=[PoolHarness(pool="p", harness="h")], task_ids=["a"], model="m",
                        proxy_url="http://127.0.0.1:1", journal=tmp_path / "journal.jsonl",
                        results=tmp_path / "results.json", runner_token_file=runner_token_file(tmp_path))
    server, _, url = serve_in_thread(create_app(EvalCoordinator(config)))
    # The only rollout is leased elsewhere: the runner under test polls for work and never gets any.
    held = httpx.post(f"{url}/v1/leases", json={"runner_id": "other", "pool": "p", "harness": "h"},
                      headers=RUNNER_AUTH, timeout=10)
    assert len(held.json()["leases"]) == 1
    metrics_port = free_port()
    runner_config = {
        "pool": "p", "runner_id": "r", "coordinator_url": url, "runner_token_file": str(runner_token_file(tmp_path)),
        "harness": {"kind": "custom", "name": "h", "dialect": "openai_chat", "command": "echo {instruction}"},
        "sandbox": {"kind": "local", "base_dir": str(tmp_path / "sandboxes")},
        "tasks": {"kind": "dir", "path": str(TASKS)}, "metrics_port": metrics_port, "http": {"head_timeout_s": 2.0},
    }
    path = tmp_path / "runner.yaml"
    path.write_text(yaml.safe_dump(runner_config))
    log = tmp_path / "runner.log"
    with log.open("wb") as out:
        runner = subprocess.Popen([str(Path(sys.executable).parent / "harnessrl"), "runner", "--config", str(path)],
                                  stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_serving(f"http://127.0.0.1:{metrics_port}/metrics", runner, 30, "runner", log.read_text)
        scrape = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        assert "harnessrl_runner" in scrape.text
        with socket.create_connection(("127.0.0.1", metrics_port)) as sock:  # a head that never ends
            sock.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\n")
            started = time.monotonic()
            assert answer_head(sock, 10.0).startswith(b"HTTP/1.1 408")
            assert time.monotonic() - started < 6
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        server.should_exit = True
