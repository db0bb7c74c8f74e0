"""What each worker of a multi-worker proxy replica serves as (workers.py), and a forwarded write that cannot
reach a worker (a closed port on 127.0.0.1: the connection is refused)."""

from __future__ import annotations

from pathlib import Path

import pytest
from harnessrl.runtime.proxy.config import ProxyConfig
from harnessrl.runtime.proxy.main import main
from harnessrl.runtime.proxy.workers import forward, sibling_urls, worker_config

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
    assert sibling_urls(_config(workers=3), 1) == ["http://127.0.0.1:8081", "http://127.0.0.1:8083"]
    assert sibling_urls(_config(), 0) == []


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
    forwarded = await forward([closed], "PUT", "/policy", b"{}", "Bearer s3cret", timeout_s=5)
    assert forwarded.bodies == []
    assert len(forwarded.failures) == 1 and forwarded.failures[0].startswith(f"{closed}: ConnectError")
    assert "s3cret" not in forwarded.failures[0]
