"""The coordinator refuses a write before reading its body (runtime/serving.py BearerBeforeBody), attacked over a
real socket on 127.0.0.1 against the real eval coordinator process (the coordinator core the learner serves too).

A 60 MB POST without the runner token is refused with 401 on its head alone: the coordinator's peak memory stays
flat (a 200 MB one took it from 58 to 458 MB when FastAPI parsed the body before the route's token check ran; one
over 64 MiB is now refused with 413 by the server itself, ServerLimits.max_body_bytes, before the token is looked at). A write must
declare its size (411), within the limit (413). Memory is the process's peak RSS (VmHWM in /proc/PID/status).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harnessrl.runtime.contracts.coordinator import PoolHarness
from harnessrl.runtime.coordinator.server import MAX_BODY_BYTES
from harnessrl.runtime.evaluation.config import EvalConfig

from tests.fixtures.raw_http import MB, answer_head, peak_rss_mb, send_until_refused
from tests.fixtures.runner_token import RUNNER_AUTH, runner_token_file
from tests.ports import free_port, wait_serving

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def eval_coordinator(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    config = EvalConfig(label="base", pools=[PoolHarness(pool="p", harness="h")], task_ids=["a"], model="m",
                        proxy_url="http://127.0.0.1:1", journal=tmp_path / "journal.jsonl",
                        results=tmp_path / "results.json", runner_token_file=runner_token_file(tmp_path), port=port,
                        log_level="warning")
    path = tmp_path / "eval.json"
    path.write_text(config.model_dump_json())
    log = tmp_path / "coordinator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "harnessrl.runtime.evaluation.coordinator", "--config",
                                 str(path)], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_serving(f"{url}/healthz", proc, 30, "eval coordinator", log.read_text)
        yield proc, url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_an_unauthenticated_60_mb_post_is_refused_before_the_coordinator_reads_it(
        eval_coordinator: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, url = eval_coordinator
    port = int(url.rsplit(":", 1)[1])
    before = peak_rss_mb(proc.pid)
    size = 60 * MB  # under the server's own limit, so the token check is what refuses it
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n{\"rollout_id\": \"" % size)
        # Refused on its head alone, before a byte of the body is read.
        refused = answer_head(sock, 5.0)
        sent = send_until_refused(sock, size, b"a" * MB)
        refused = refused or answer_head(sock, 30.0)
    after = peak_rss_mb(proc.pid)
    assert after - before < 30, f"peak RSS {before:.0f} -> {after:.0f} MB after {sent / MB:.0f} MB sent"
    assert refused.startswith(b"HTTP/1.1 401"), refused[:200]
    assert b"missing runner bearer token" in refused
    # The coordinator still serves, and an honest runner is unaffected.
    lease = {"runner_id": "r", "pool": "p", "harness": "h"}
    assert httpx.post(f"{url}/v1/leases", json=lease, headers=RUNNER_AUTH, timeout=10).status_code == 200


def test_a_write_must_declare_a_body_within_the_limit(eval_coordinator: tuple[subprocess.Popen[bytes], str]) -> None:
    _, url = eval_coordinator
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:  # a head alone: its body never comes
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: %s\r\n"
                     b"content-length: %d\r\n\r\n" % (RUNNER_AUTH["Authorization"].encode(), MAX_BODY_BYTES + 1))
        too_big = answer_head(sock, 10.0)
    assert too_big.startswith(b"HTTP/1.1 413") and b"over the limit" in too_big, too_big[:200]

    def chunks() -> Iterator[bytes]:
        yield b"{}"

    unsized = httpx.post(f"{url}/v1/leases", content=chunks(), headers=RUNNER_AUTH, timeout=10)
    assert unsized.status_code == 411 and unsized.json() == {"detail": "a Content-Length is required"}
