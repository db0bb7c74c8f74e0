"""Every server's requests are bounded in size and time (runtime/serving.py), attacked over real sockets on
127.0.0.1 against real processes: the `harnessrl proxy` (the other programs build their servers the same way), the
operator's liveness and /metrics endpoints, and the adapter store.

- Unfinished request heads (128 MB of headers on each of four connections) are cut at the head limit with 431,
  and the proxy's peak memory stays flat (its peak went from 65 to 195 MB before).
- Slow heads (slowloris: 200 connections, half sending nothing, half a header byte now and then) are all closed
  once their head takes longer than the head timeout (before, all 200 were held), and the proxy still serves.
- Slow bodies (a head, then a body byte now and then) are cut with 408 once the body takes longer than the body
  timeout (before, each held its connection and its request's task for as long as it liked); a body over the
  server's limit, declared or chunked, is refused with 413 before it is read.
- The proxy's admin writes read at most 1 MiB (a 60 MB `PUT /policy` with the admin token was read whole), and
  not a byte without the token.
- The operator's endpoints (kopf's aiohttp liveness server and prometheus_client's thread-per-connection server,
  with no deadline on a head) and the adapter store (plain uvicorn) are built the same way.
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
from harnessrl.runtime.contracts.coordinator import PoolHarness
from harnessrl.runtime.evaluation.config import EvalConfig
from harnessrl.runtime.evaluation.coordinator import EvalCoordinator, create_app

from tests.fixtures.adapter_store import STORE_TOKEN, start_store
from tests.fixtures.proxy_server import ProxyFactory, serve_in_thread
from tests.fixtures.raw_http import MB, answer_head, closed_within, peak_rss_mb, send_until_refused
from tests.fixtures.runner_token import RUNNER_AUTH, runner_token_file
from tests.ports import free_port, wait_serving

pytestmark = pytest.mark.timeout(180)
TASKS = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "tasks" / "test"


def endless_head(port: int, request_line: bytes) -> tuple[bytes, int]:
    """A request head that never ends (8 KB header lines, up to 128 MB) sent to `port`: what the server answered,
    and how many bytes it took before it closed the connection."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request_line + b"\r\nhost: x\r\n")
        sent = send_until_refused(sock, 128 * MB, b"x-pad: " + b"a" * 8000 + b"\r\n")
        return answer_head(sock, 10.0), sent


@pytest.fixture
def proxy(proxy_factory: ProxyFactory, scripted_engine_factory: Callable[..., Any]) -> Any:
    engine = scripted_engine_factory(tokenizer="bytes")
    return proxy_factory([engine.root_url], http={"head_timeout_s": 2.0, "body_timeout_s": 2.0}, allocator="system")


def test_unfinished_headers_are_cut_at_the_head_limit_and_cost_the_proxy_no_memory(proxy: Any) -> None:
    pid = proxy.proc.pid
    before = peak_rss_mb(pid)
    answers, sent = [], 0
    for _ in range(4):
        answer, taken = endless_head(proxy.port, b"POST /v1/chat/completions HTTP/1.1")
        answers.append(answer)
        sent += taken
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
        started = time.monotonic()
        closed, _ = closed_within(conns, 15.0, trickle=b"x", trickling=range(1, len(conns), 2))
        assert len(closed) == len(conns), f"{len(conns) - len(closed)} slow connections still held"
        assert time.monotonic() - started < 15
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


def test_trickled_bodies_are_cut_after_the_body_timeout(proxy: Any) -> None:
    """A session request's head with its token, then its body a byte at a time: before, 50 of them held their
    connections (and the tasks waiting on their bodies) as long as they trickled."""
    auth = b"authorization: %s\r\n" % RUNNER_AUTH["Authorization"].encode()
    conns = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(50)]
    try:
        for sock in conns:
            sock.sendall(b"POST /sessions HTTP/1.1\r\nhost: x\r\n%scontent-type: application/json\r\n"
                         b"content-length: 100000\r\n\r\n{" % auth)
        started = time.monotonic()
        closed, answers = closed_within(conns, 10.0, trickle=b" ")
        assert len(closed) == len(conns), f"{len(conns) - len(closed)} trickled bodies still held"
        assert time.monotonic() - started < 6
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers), {a[:60] for a in answers}
    finally:
        for sock in conns:
            sock.close()
    assert httpx.get(f"{proxy.url}/healthz", timeout=10).status_code == 200


def test_a_body_over_the_servers_limit_is_refused_before_it_is_read() -> None:
    """A server whose app reads whatever body comes (as starlette's `request.body()` does): a declared body over
    the server's limit never reaches the app, and a chunked one (no size up front) is cut at the limit."""
    from harnessrl.runtime import serving
    from harnessrl.runtime.contracts.server_limits import ServerLimits

    read: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        size, more = 0, True
        while more:
            message = await receive()
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        read.append(size)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"read"})

    port = free_port()
    server = serving.server(app, "127.0.0.1", port, ServerLimits(max_body_bytes=MB), lifespan="off")
    serving.run_in_thread(server)
    try:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % (200 * MB))
            assert answer_head(sock, 5.0).startswith(b"HTTP/1.1 413")
        assert read == []
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
            chunk = b"%x\r\n%s\r\n" % (64 * 1024, b"a" * 64 * 1024)
            sent = send_until_refused(sock, 200 * MB, chunk)
            answer = answer_head(sock, 5.0)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
        assert sent < 100 * MB
        assert read == [] or read[0] <= MB  # the app saw no more than the limit (and a disconnect)
        assert httpx.post(f"http://127.0.0.1:{port}/", content=b"x" * 1000, timeout=10).text == "read"
    finally:
        server.should_exit = True


def test_an_admin_write_reads_a_bounded_body_and_none_without_the_token(proxy: Any) -> None:
    """60 MB: under the server's own limit (ServerLimits.max_body_bytes), which would refuse it on its head."""
    pid = proxy.proc.pid
    before = peak_rss_mb(pid)
    size = 60 * MB
    for auth, status in ((b"", b"401"), (b"authorization: Bearer %s\r\n" % proxy.admin_token.encode(), b"413")):
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            sock.sendall(b"PUT /policy HTTP/1.1\r\nhost: x\r\n%scontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n{\"model\": \"" % (auth, size))
            refused = answer_head(sock, 5.0)  # on the head alone, before a byte of the body is read
            sent = send_until_refused(sock, size, b"a" * MB)
            refused = refused or answer_head(sock, 10.0)
        assert refused.startswith(b"HTTP/1.1 " + status), refused[:200]
        assert sent < size
    assert b"over the limit of 1048576 bytes" in refused
    after = peak_rss_mb(pid)
    assert after - before < 30, f"peak RSS {before:.0f} -> {after:.0f} MB"
    assert httpx.get(f"{proxy.url}/policy", timeout=10).status_code == 200


def test_the_adapter_store_bounds_heads_and_bodies(tmp_path: Path) -> None:
    """The store was plain uvicorn: an unfinished head grew without limit, and a trickled upload was held."""
    with start_store(tmp_path, "--body-timeout-seconds", "2") as (url, _, proc):
        port = int(url.rsplit(":", 1)[1])
        before = peak_rss_mb(proc.pid)
        answer, sent = endless_head(port, b"PUT /adapters/a HTTP/1.1")
        assert answer.startswith(b"HTTP/1.1 431") and sent < 16 * MB, answer[:100]
        assert peak_rss_mb(proc.pid) - before < 30
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"PUT /adapters/a HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\n"
                         b"content-length: 1000000\r\n\r\n" % STORE_TOKEN.encode())
            closed, answers = closed_within([sock], 10.0, trickle=b"a")
        assert closed and answers[0].startswith(b"HTTP/1.1 408"), answers[0][:100]
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200


def test_the_operators_endpoints_bound_heads_and_still_answer(kube_api: Any, tmp_path: Path) -> None:
    """--liveness (kopf's aiohttp server before) and --metrics-port (prometheus_client's, a thread per
    connection): slow heads are closed after the head timeout (before, all 50 were held on each), an endless one is
    cut at 431 (both cut it before too, with 400 and 431); both still answer, and the operator stops on SIGTERM."""
    liveness, metrics = free_port(), free_port()
    log = tmp_path / "operator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "harnessrl.cli", "operator", "--standalone", "--namespace", "default",
             "--kubeconfig", str(kube_api.kubeconfig_path), "--liveness", f"http://127.0.0.1:{liveness}/healthz",
             "--metrics-port", str(metrics), "--head-timeout-seconds", "2"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_serving(f"http://127.0.0.1:{liveness}/healthz", proc, 30, "operator", log.read_text)
        wait_serving(f"http://127.0.0.1:{metrics}/metrics", proc, 30, "operator", log.read_text)
        before = peak_rss_mb(proc.pid)
        for port in (liveness, metrics):
            conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
            try:
                for sock in conns[1::2]:
                    sock.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\nx-slow: ")
                closed, _ = closed_within(conns, 8.0, trickle=b"")
                assert len(closed) == len(conns), f"{len(conns) - len(closed)} slow connections still held"
            finally:
                for sock in conns:
                    sock.close()
            answer, sent = endless_head(port, b"GET /healthz HTTP/1.1")
            assert answer.startswith(b"HTTP/1.1 431") and sent < 16 * MB, answer[:100]
        assert peak_rss_mb(proc.pid) - before < 30
        health = httpx.get(f"http://127.0.0.1:{liveness}/healthz", timeout=10)
        assert health.status_code == 200 and health.json() == {}
        assert "harnessrl_operator" in httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
