"""Each real harness CLI (installed by `make tools`) runs a shipped task through the runner: local sandbox, the
real proxy process in front of the scripted engine (vLLM's wire shape, token ids and logprobs included), and the
learner's real coordinator app for leases and completions. The engine's script answers with a tool call in the
harness's own tool names that writes the answer, then a final message."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from harnessrl.runtime.contracts.coordinator import OutcomeKind
from harnessrl.runtime.harness.sandboxes.local import tagged_pids

from tests.fakes.scripted_engine import ScriptedReply, ScriptedToolCall
from tests.fixtures.harness_clis import TASK, TASKS, assert_breaks_reported, one_rollout
from tests.ports import free_port

pytestmark = [pytest.mark.clis, pytest.mark.usefixtures("clis_on_path")]

ANSWER = json.loads((TASKS / "train" / TASK / "tests" / "expected.json").read_text())["value"]
DONE = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # how mini-swe-agent ends its episode


def shell_call(harness: str, command: str) -> ScriptedToolCall:
    """A shell tool call as each harness names and shapes it."""
    if harness == "codex":
        return ScriptedToolCall(name="exec_command", arguments={"cmd": command})
    name = {"claude-code": "Bash", "gemini-cli": "run_shell_command", "qwen-code": "run_shell_command"}.get(harness, "bash")
    return ScriptedToolCall(name=name, arguments={"command": command, "description": "write the answer"})


def script(harness: str, answer: object, delay_s: float = 0.0) -> list[ScriptedReply]:
    final = (
        ScriptedReply(tool_calls=[shell_call(harness, DONE)], when_last_role="tool")
        if harness == "mini-swe-agent"
        else ScriptedReply(content="I wrote the answer to answer.txt.", when_last_role="tool")
    )
    write = shell_call(harness, f"echo {answer} > answer.txt")
    if harness == "claude-code":
        # Claude Code ends its prompts with a system reminder, so the last role says nothing: write once, then finish.
        return [ScriptedReply(tool_calls=[write], when_tools=True, max_uses=1, delay_s=delay_s),
                ScriptedReply(content="I wrote the answer to answer.txt.", when_tools=True)]
    return [ScriptedReply(tool_calls=[write], when_tools=True, when_last_role="user", delay_s=delay_s), final]


@pytest.mark.parametrize("harness", ["claude-code", "codex", "opencode", "gemini-cli", "qwen-code", "mini-swe-agent"])
async def test_cli_solves_a_shipped_task(rollout_stack: Any, harness: str) -> None:
    stack = rollout_stack([(f"{harness}-pool", harness)], TASK)
    stack.engine.set_script(script(harness, ANSWER))
    _, completion, ack = await one_rollout(stack, harness, timeouts={"harness_s": 120})
    assert completion.outcome == OutcomeKind.solved, completion.error
    assert completion.correctness == 1.0 and completion.tool_calls >= 1
    # The scripted calls use the harness's own tool, as its schema shapes it: no mismatch.
    assert (completion.unknown_tool_calls, completion.invalid_tool_calls) == (0, 0)
    assert "CORRECT" in completion.grader_output
    # The coordinator took it, fetched the session's sequences from the proxy, and scored it with the bonus.
    assert ack is not None and ack.status == "accepted" and ack.scored and ack.reward is not None and ack.reward > 1.0
    assert stack.coordinator.status().rollouts_scored == 1
    # The turn that carries the tool result links to the turn that made the tool call: the harness kept its
    # history as a token prefix, so both turns are one training sequence.
    async with httpx.AsyncClient(timeout=30) as http:
        nodes = (await http.get(f"{stack.proxy.url}/sessions/{completion.session_id}/turns",
                                headers=stack.proxy.admin_headers)).json()
    callers = {n["id"] for n in nodes if n["turn"]["tool_calls"] > 0}
    assert any(n["parent"] in callers for n in nodes), [(n["id"], n["parent"], n["turn"]["tool_calls"]) for n in nodes]
    breaks = assert_breaks_reported(stack, completion, nodes)
    pool = stack.coordinator.status().pools[f"{harness}-pool"]
    assert pool.prefix_breaks == breaks and (pool.captured_rollouts, pool.sequences) == (1, 1 + breaks.total())
    assert pool.sampled_tokens == sum(len(n["turn"]["completion_ids"]) for n in nodes if n["turn"]["trainable"])


async def test_another_harnesss_tool_is_counted_for_the_pool(rollout_stack: Any) -> None:
    stack = rollout_stack([("codex-pool", "codex")], TASK)
    # The model calls Claude Code's shell tool inside Codex, then Codex's own with arguments it does not take.
    foreign = ScriptedToolCall(name="Bash", arguments={"command": "ls"}, offered_only=False)
    broken = ScriptedToolCall(name="exec_command", arguments={"command": "ls"})
    stack.engine.set_script([ScriptedReply(tool_calls=[foreign], when_tools=True, when_last_role="user"),
                             ScriptedReply(tool_calls=[broken], when_tools=True, max_uses=1),
                             ScriptedReply(content="Done.", when_tools=True)])
    _, completion, _ = await one_rollout(stack, "codex")
    assert (completion.unknown_tool_calls, completion.invalid_tool_calls) == (1, 1), completion
    pool = stack.coordinator.status().pools["codex-pool"]
    assert (pool.unknown_tool_calls, pool.invalid_tool_calls) == (1, 1)


async def test_wrong_answer_gets_reward_zero(rollout_stack: Any) -> None:
    stack = rollout_stack([("codex-pool", "codex")], TASK)
    stack.engine.set_script(script("codex", int(ANSWER) + 1))
    _, completion, ack = await one_rollout(stack, "codex")
    assert completion.outcome == OutcomeKind.wrong and completion.correctness == 0.0
    assert "WRONG" in completion.grader_output
    assert ack is not None and ack.scored and ack.reward == 0.0


async def test_hanging_harness_ends_as_timeout_and_leaves_no_process(rollout_stack: Any) -> None:
    stack = rollout_stack([("codex-pool", "codex")], TASK)
    stack.engine.set_script(script("codex", ANSWER, delay_s=300))  # the model never answers in time
    started = time.monotonic()
    runner, completion, ack = await one_rollout(stack, "codex", timeouts={"harness_s": 8})
    assert completion.outcome == OutcomeKind.timeout, completion.error
    assert time.monotonic() - started < 60
    assert tagged_pids(f"{runner.provider.prefix}-") == []  # nothing the harness started is still running
    assert ack is not None and ack.scored and ack.reward == 0.0


async def test_unreachable_proxy_is_an_infra_error_never_a_zero(rollout_stack: Any) -> None:
    stack = rollout_stack([("codex-pool", "codex")], TASK, proxy_url=f"http://127.0.0.1:{free_port()}")  # nothing listens
    _, completion, ack = await one_rollout(stack, "codex")
    assert completion.outcome == OutcomeKind.infra_error and "proxy unreachable" in (completion.error or "")
    assert ack is not None and not ack.scored and ack.reward is None
    assert stack.coordinator.status().rollouts_unscored == 1
