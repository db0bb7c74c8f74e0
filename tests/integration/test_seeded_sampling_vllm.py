"""Seeded sampling on the real engine: in a seeded run every call carries a seed derived from the run's seed, the
rollout and the call's index (runtime/proxy/seeding.py), so the same call of the same rollout repeats token for
token at temperature 1, while another rollout's call draws other tokens."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from harnessrl.runtime.proxy.seeding import call_seed

from tests.fixtures.proxy_server import EngineTee, ProxyProcess, engine_truth

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

RUN_SEED = 7
PROMPT = [{"role": "user", "content": "List the files."}]


@pytest.fixture(scope="module")
def vllm_proxy_overrides() -> dict[str, Any]:
    return {"sampling_seed": RUN_SEED}  # training calls sample at temperature 1, the default


def _call(proxy: ProxyProcess, sid: str, messages: list[dict[str, Any]] = PROMPT) -> dict[str, Any]:
    answer = httpx.post(f"{proxy.url}/v1/chat/completions", headers={"authorization": f"Bearer {sid}"},
                        timeout=120, json={"model": "any", "max_tokens": 24, "messages": messages})
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["choices"][0]["message"])


def _seed(body: dict[str, Any]) -> int:
    """The seed of a chat call, or of a spliced prompt's generate call (in its sampling params)."""
    return int(body["seed"] if "seed" in body else body["sampling_params"]["seed"])


def _session(proxy: ProxyProcess, rollout_id: str) -> str:
    session = httpx.post(f"{proxy.url}/sessions", headers=proxy.admin_headers,
                         json={"rollout_id": rollout_id, "task_id": "t", "harness": "h", "group_id": "g"})
    assert session.status_code == 200, session.text
    return str(session.json()["session_id"])


def test_a_seeded_call_repeats_token_for_token_and_another_rollout_draws_others(
    vllm_proxy: ProxyProcess, vllm_engine_tee: EngineTee
) -> None:
    first, rerun, other = (_session(vllm_proxy, rollout) for rollout in ("g000000-r000", "g000000-r000", "g000000-r001"))
    reply = _call(vllm_proxy, first)
    for sid in (rerun, other, first):
        _call(vllm_proxy, sid)
    # The next turn, its history holding the first reply (a spliced prompt where splicing changes it).
    _call(vllm_proxy, first, [*PROMPT, {"role": "assistant", "content": reply["content"] or ""},
                              {"role": "user", "content": "And the hidden ones?"}])
    bodies = [body for body, _ in vllm_engine_tee.calls]
    assert [_seed(body) for body in bodies] == [
        call_seed(RUN_SEED, "g000000-r000", 0), call_seed(RUN_SEED, "g000000-r000", 0),
        call_seed(RUN_SEED, "g000000-r001", 0), call_seed(RUN_SEED, "g000000-r000", 1),
        call_seed(RUN_SEED, "g000000-r000", 2),
    ]
    assert {body["temperature"] for body in bodies[:4]} == {1.0}
    sampled = [engine_truth(raw)[1] for _, raw in vllm_engine_tee.calls]
    assert len(sampled[0]) >= 8
    assert sampled[1] == sampled[0]  # the same rollout's same call, in another session: the same tokens
    assert sampled[2] != sampled[0]  # another rollout of the group
    assert sampled[3] != sampled[0]  # the rollout's next call, on the same prompt
