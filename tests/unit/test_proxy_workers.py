"""What each worker of a multi-worker proxy replica serves as (workers.py), a forwarded write that cannot
reach a worker (a closed port on 127.0.0.1: the connection is refused), and how the supervisor tells a hung worker
from a busy one (its heartbeat)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from harnessrl.runtime.contracts.proxy_config import ProxyConfig
from harnessrl.runtime.proxy.main import main
from harnessrl.runtime.proxy.metrics import ProxyMetrics, merged_exposition
from harnessrl.runtime.proxy.workers import (
    HealthTracker,
    Heartbeat,
    forward,
    proxy_ports,
    worker_config,
    worker_role,
)
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.ports import free_port


def _config(**fields: object) -> ProxyConfig:
    return ProxyConfig.model_validate({"upstream_urls": ["http://e0:8000"], "served_model": "m",
                                       "admin_token_file": "t", "journal_dir": "j", "port": 8080, **fields})


def test_each_worker_has_its_own_port_id_and_public_url() -> None:
    config = _config(workers=3, replica_id="run-proxy-1", public_base_url="http://run-proxy-1.run-proxy-pods.ns.svc:8080")
    second = worker_config(config, 1)
    assert (second.port, second.replica_id, second.workers) == (8082, "run-proxy-1-w1", 1)
    assert second.base_url() == "http://run-proxy-1.run-proxy-pods.ns.svc:8082"
    assert second.journal_dir == config.journal_dir  # one volume; the journal file is named by the replica id
    assert worker_config(_config(workers=2, host="0.0.0.0"), 0).base_url() == "http://127.0.0.1:8081"
    assert worker_config(_config(workers=2, public_base_url="http://[fd00::1]:8080"), 1).base_url() == (
        "http://[fd00::1]:8082")
    assert worker_role(_config(workers=3), 1).name == "w1"
    assert worker_role(_config(workers=3), 1).siblings == {"w0": "http://127.0.0.1:8081", "w2": "http://127.0.0.1:8083"}
    # What a worker may relay to: the whole replica's ports, not only its own config's one.
    assert worker_role(_config(workers=3), 1).ports == {8080, 8081, 8082, 8083}
    assert proxy_ports(_config(relay_ports=[9090])) == {8080, 9090}


def test_the_proxy_command_refuses_workers_without_a_fixed_port(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "token").write_text("t")
    path = tmp_path / "proxy.yaml"
    path.write_text(f"port: 0\nworkers: 2\nupstream_urls: [http://e0:8000]\nserved_model: tiny\n"
                    f"admin_token_file: {tmp_path / 'token'}\njournal_dir: {tmp_path / 'journal'}\n")
    assert main(["--config", str(path)]) == 2
    assert "workers: 2 need a fixed port" in capsys.readouterr().err
    path.write_text(path.read_text().replace("port: 0", "port: 9000"))
    assert main(["--config", str(path), "--worker", "2"]) == 2
    assert "--worker 2 is not one of the config's 2 workers" in capsys.readouterr().err


async def test_a_forwarded_write_names_each_worker_it_did_not_reach() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    forwarded = await forward({"w1": closed}, "PUT", "/policy", b"{}", "Bearer s3cret", timeout_s=5)
    assert forwarded.bodies == []
    assert len(forwarded.failures) == 1 and forwarded.failures[0].startswith(f"{closed}: ConnectError")
    assert "s3cret" not in forwarded.failures[0]


def test_a_scrape_of_several_workers_labels_each_series_with_its_worker() -> None:
    workers = {"w0": ProxyMetrics(), "w1": ProxyMetrics()}
    workers["w0"].requests.labels("openai_chat", "ok").inc(3)
    workers["w1"].requests.labels("openai_chat", "ok").inc(2)
    workers["w1"].upstream_latency.observe(0.02)
    merged = merged_exposition({name: generate_latest(m.registry).decode() for name, m in workers.items()})
    families = {f.name: f for f in text_string_to_metric_families(merged.decode())}
    oks = {s.labels["worker"]: s.value for s in families["harnessrl_proxy_requests"].samples
           if s.name.endswith("_total")}
    assert oks == {"w0": 3.0, "w1": 2.0}
    counts = {s.labels["worker"]: s.value for s in families["harnessrl_proxy_upstream_seconds"].samples
              if s.name.endswith("_count")}
    assert counts == {"w0": 0.0, "w1": 1.0}
    assert families["harnessrl_proxy_upstream_seconds"].type == "histogram"


def test_a_worker_is_hung_after_enough_missed_checks_in_a_row_or_when_it_never_answers_after_its_start() -> None:
    health = HealthTracker(failures_allowed=3, startup_timeout_s=60)
    for _ in range(10):  # starting: replaying its journal, not listening yet
        health.observe(11, ok=False)
    assert not health.hung(11, age_s=59)
    assert health.hung(11, age_s=61)  # still not answering a minute after its start
    health.observe(11, ok=True)
    health.observe(11, ok=False)
    health.observe(11, ok=False)
    assert not health.hung(11, age_s=600)
    health.observe(11, ok=True)  # an answer starts the count again
    for _ in range(3):
        health.observe(11, ok=False)
    assert health.hung(11, age_s=600) and not health.hung(12, age_s=1)
    health.forget(11)
    assert not health.hung(11, age_s=1)


async def test_a_busy_event_loop_still_beats_and_a_blocked_one_does_not() -> None:
    """The heartbeat is a loop timer: it fires between the callbacks of a saturated loop (here 2,000 ready tasks,
    each holding the loop 1 ms at a time), where a request would wait its turn, and not while a callback blocks."""
    beats, fd = os.pipe()
    os.set_blocking(beats, False)
    heartbeat = Heartbeat(fd, interval_s=0.05)

    def read_beats() -> int:
        try:
            return len(os.read(beats, 4096))
        except BlockingIOError:
            return 0

    async def busy() -> None:
        for _ in range(20):
            spin_until = time.perf_counter() + 0.001
            while time.perf_counter() < spin_until:
                pass
            await asyncio.sleep(0)

    try:
        heartbeat.start()
        read_beats()
        started = time.perf_counter()
        await asyncio.gather(*(busy() for _ in range(100)))  # 2,000 ms of callbacks, queued all at once
        busy_s = time.perf_counter() - started
        # Beats kept coming (one per loop iteration at most, and an iteration ran every ready task: ~100 ms).
        assert read_beats() >= busy_s / 0.4
        time.sleep(0.5)  # a callback that blocks the loop: no timer runs
        assert read_beats() <= 1
    finally:
        heartbeat.stop()
        os.close(beats)
        os.close(fd)
