"""The scripted engine stand-in, driven by the official `openai` SDK over loopback: its vLLM-shaped responses parse,
streaming and not, with token ids, logprobs and tool calls; and its token ids are prefix-stable across turns."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.scripted_engine import ScriptedEngineServer, ScriptedReply, ScriptedToolCall

CAPTURE: dict[str, Any] = {"return_token_ids": True, "top_logprobs": 0}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "run_shell_command",
            "description": "Run a shell command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
TOOL_THEN_ANSWER = [
    ScriptedReply(
        when_last_role="user",
        when_tools=True,
        tool_calls=[
            ScriptedToolCall(name=["Bash", "shell", "run_shell_command"], arguments={"command": "ls"})
        ],
    ),
    ScriptedReply(when_last_role="tool", content="The directory holds a.py."),
]


def client_for(server: ScriptedEngineServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="session-key", max_retries=0)


def test_text_reply_parses_with_token_ids_and_logprobs(scripted_engine: ScriptedEngineServer) -> None:
    scripted_engine.set_script([ScriptedReply(content="Hello there.")])
    response = client_for(scripted_engine).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], logprobs=True, extra_body=CAPTURE
    )
    choice = response.choices[0]
    assert choice.message.content == "Hello there."
    assert choice.finish_reason == "stop"
    extra = response.model_extra or {}
    call = scripted_engine.engine.calls[-1]
    assert extra["prompt_token_ids"] == call.prompt_ids
    assert (choice.model_extra or {})["token_ids"] == call.completion_ids
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert [lp.logprob for lp in choice.logprobs.content] == call.logprobs
    assert "".join(lp.token for lp in choice.logprobs.content) == "Hello there."
    assert response.usage is not None and response.usage.completion_tokens == len(call.completion_ids)


def test_stream_parses_and_carries_every_token_id(scripted_engine: ScriptedEngineServer) -> None:
    scripted_engine.set_script([ScriptedReply(content="Streaming works, token by token.")])
    stream = client_for(scripted_engine).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=CAPTURE,
    )
    text, ids, logprobs, prompt_ids, finish, usage = "", [], [], None, None, None
    for chunk in stream:
        prompt_ids = (chunk.model_extra or {}).get("prompt_token_ids", prompt_ids)
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            ids += (choice.model_extra or {}).get("token_ids") or []
            logprobs += [lp.logprob for lp in (choice.logprobs.content or [])] if choice.logprobs else []
            finish = choice.finish_reason or finish
    call = scripted_engine.engine.calls[-1]
    assert text == "Streaming works, token by token."
    assert (prompt_ids, ids, logprobs, finish) == (
        call.prompt_ids,
        call.completion_ids,
        call.logprobs,
        "stop",
    )
    assert (
        usage is not None and usage.completion_tokens == len(ids) and usage.prompt_tokens == len(prompt_ids)
    )


@pytest.mark.parametrize("tokenizer", ["tiny", "bytes", "fast"])
def test_tool_call_then_answer_is_prefix_stable(
    scripted_engine_factory: Callable[..., ScriptedEngineServer], tokenizer: str
) -> None:
    server = scripted_engine_factory(tokenizer=tokenizer)
    server.set_script(TOOL_THEN_ANSWER)
    client = client_for(server)
    messages: list[Any] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "List."},
    ]
    first = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, extra_body=CAPTURE)
    calls = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls" and calls is not None
    function = calls[0].function  # type: ignore[union-attr]
    assert (function.name, json.loads(function.arguments)) == ("run_shell_command", {"command": "ls"})
    # The harness replays the history (re-serialising the arguments compactly) with the tool's result.
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": calls[0].id,
                    "type": "function",
                    "function": {"name": function.name, "arguments": '{"command":"ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0].id, "content": [{"type": "text", "text": "a.py"}]},
    ]
    second = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, extra_body=CAPTURE)
    assert second.choices[0].message.content == "The directory holds a.py."
    turn1, turn2 = list(server.engine.calls)
    assert (
        turn2.prompt_ids[: len(turn1.prompt_ids) + len(turn1.completion_ids)]
        == turn1.prompt_ids + turn1.completion_ids
    )


def test_streamed_tool_call_accumulates_in_the_sdk(scripted_engine: ScriptedEngineServer) -> None:
    scripted_engine.set_script(
        [
            ScriptedReply(
                content="Let me look.",
                tool_calls=[
                    ScriptedToolCall(name="run_shell_command", arguments={"command": "ls"}),
                    ScriptedToolCall(name="run_shell_command", arguments={"command": "pwd"}),
                ],
            )
        ]
    )
    with client_for(scripted_engine).chat.completions.stream(
        model="tiny", messages=[{"role": "user", "content": "go"}], tools=TOOLS, extra_body=CAPTURE
    ) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert message.content == "Let me look."
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls or []] == [  # type: ignore[union-attr]
        ("run_shell_command", '{"command": "ls"}'),
        ("run_shell_command", '{"command": "pwd"}'),
    ]


def test_side_calls_do_not_consume_the_sessions_replies(scripted_engine: ScriptedEngineServer) -> None:
    """A title-generation call without tools (as OpenCode makes) gets the default, not the scripted tool call."""
    scripted_engine.set_script(TOOL_THEN_ANSWER)
    client = client_for(scripted_engine)
    title = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Title this"}])
    assert title.choices[0].message.content == "Done."
    real = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "List."}], tools=TOOLS
    )
    assert real.choices[0].message.tool_calls


def test_errors_come_back_in_vllms_shape(
    scripted_engine_factory: Callable[..., ScriptedEngineServer],
) -> None:
    server = scripted_engine_factory(tokenizer="bytes", max_model_len=400)
    server.set_script([ScriptedReply(tool_calls=[ScriptedToolCall(name=["Bash"], arguments={})])])
    client = client_for(server)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 400"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x" * 500}])
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match=r"wants one of \['Bash'\]"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], tools=TOOLS)
    response = httpx.post(f"{server.base_url}/chat/completions", content=b"{not json")
    assert response.status_code == 400 and response.json()["error"]["type"] == "BadRequestError"


def test_lora_adapters_load_unload_and_serve(scripted_engine: ScriptedEngineServer, tmp_path: Any) -> None:
    from harnessrl.runtime.engine.lora import LoraEndpointError, load_lora_adapter, unload_lora_adapter

    load_lora_adapter(scripted_engine.base_url, "policy-v1", str(tmp_path))
    ids = [m.id for m in client_for(scripted_engine).models.list()]
    assert ids == ["tiny", "policy-v1"]
    reply = client_for(scripted_engine).chat.completions.create(
        model="policy-v1", messages=[{"role": "user", "content": "x"}]
    )
    assert reply.model == "policy-v1"
    with pytest.raises(LoraEndpointError, match="404"):
        load_lora_adapter(scripted_engine.root_url, "policy-v2", str(tmp_path / "missing"))
    unload_lora_adapter(scripted_engine.base_url, "policy-v1")
    assert [m.id for m in client_for(scripted_engine).models.list()] == ["tiny"]


def test_script_can_be_set_over_http(scripted_engine: ScriptedEngineServer) -> None:
    body = {"replies": [{"content": "from http"}], "default": None}
    assert httpx.put(f"{scripted_engine.root_url}/scripted/script", json=body).json() == {"replies": 1}
    reply = client_for(scripted_engine).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}]
    )
    assert reply.choices[0].message.content == "from http"
