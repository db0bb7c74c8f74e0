"""The scripted engine's pure parts: reply selection, tokenisation, and how replies become vLLM bodies/chunks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fakes.scripted_engine import (
    ByteChatTokenizer,
    Script,
    ScriptedEngine,
    ScriptedReply,
    ScriptedToolCall,
    ScriptError,
    VllmError,
    chat_response,
    stream_chunks,
)

TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]


def engine(stride: int = 1, **kw: Any) -> ScriptedEngine:
    return ScriptedEngine(ByteChatTokenizer(stride=stride), **kw)


def request(messages: list[dict[str, Any]] | None = None, **kw: Any) -> dict[str, Any]:
    body = {"model": "tiny", "messages": messages or [{"role": "user", "content": "hi"}]}
    return body | {"logprobs": True, "return_token_ids": True} | kw


def reassemble(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What a client accumulates from the chunks (the openai SDK's rules)."""
    content, ids, calls, finish = "", [], {}, None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            ids += choice.get("token_ids") or []
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call["index"], {"name": "", "arguments": ""})
                slot["name"] += call.get("function", {}).get("name", "")
                slot["arguments"] += call.get("function", {}).get("arguments", "")
            finish = choice["finish_reason"] or finish
    return {"content": content, "ids": ids, "calls": [calls[k] for k in sorted(calls)], "finish": finish}


def test_rules_pick_by_tools_role_and_text_and_count_uses() -> None:
    e = engine()
    e.set_script(
        Script(
            replies=[
                ScriptedReply(when_contains="secret", content="found"),
                ScriptedReply(when_tools=True, when_last_role="user", content="tool turn", max_uses=1),
                ScriptedReply(when_last_role="tool", content="after tool"),
            ],
            default=None,
        )
    )
    assert (
        e.complete(request([{"role": "user", "content": "a secret"}]) | {"tools": TOOLS}).content == "found"
    )
    assert e.complete(request(tools=TOOLS)).content == "tool turn"
    with pytest.raises(ScriptError, match="no scripted reply"):
        e.complete(request(tools=TOOLS))  # used up, and no default
    tool_result = [
        {"role": "user", "content": "x"},
        {"role": "tool", "content": [{"type": "text", "text": "ok"}]},
    ]
    assert e.complete(request(tool_result)).content == "after tool"


def test_tool_name_is_the_first_candidate_the_request_offers() -> None:
    e = engine()
    e.set_script(
        [ScriptedReply(tool_calls=[ScriptedToolCall(name=["Bash", "shell"], arguments={"command": "ls"})])]
    )
    c = e.complete(request(tools=TOOLS))
    assert [call["function"]["name"] for call in c.tool_calls] == ["shell"]
    assert c.finish_reason == "tool_calls" and c.content is None


@pytest.mark.parametrize("stride", [1, 4])
def test_stream_reassembles_to_the_non_streaming_body(stride: int) -> None:
    e = engine(stride)
    e.set_script(
        [
            ScriptedReply(
                content="Käse → ok",
                tool_calls=[
                    ScriptedToolCall(name="shell", arguments={"command": "ls -la"}),
                    ScriptedToolCall(name="shell", arguments='{"command": "pwd"}'),
                ],
            )
        ]
    )
    body = request(tools=TOOLS, stream=True, stream_options={"include_usage": True})
    c = e.complete(body)
    full = chat_response(c, body, "chatcmpl-1", 0)
    chunks = list(stream_chunks(c, body, "chatcmpl-1", 0))
    got = reassemble(chunks)
    message = full["choices"][0]["message"]
    assert got["content"] == message["content"] == "Käse → ok"
    assert got["calls"] == [
        {"name": t["function"]["name"], "arguments": t["function"]["arguments"]}
        for t in message["tool_calls"]
    ]
    assert [json.loads(x["arguments"]) for x in got["calls"]] == [{"command": "ls -la"}, {"command": "pwd"}]
    assert got["ids"] == full["choices"][0]["token_ids"] == c.completion_ids
    assert got["finish"] == "tool_calls"
    assert chunks[0]["prompt_token_ids"] == full["prompt_token_ids"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(c.completion_ids)
    logprobs = [e["logprob"] for ch in chunks[1:-1] for e in ch["choices"][0]["logprobs"]["content"]]
    assert logprobs == [e["logprob"] for e in full["choices"][0]["logprobs"]["content"]]
    assert all(-3.02 < lp < 0 for lp in logprobs)


def test_max_tokens_cuts_the_reply_like_an_engine() -> None:
    e = engine()
    e.set_script([ScriptedReply(tool_calls=[ScriptedToolCall(name="shell", arguments={"command": "ls"})])])
    body = request(tools=TOOLS, max_tokens=5)
    c = e.complete(body)
    assert (c.finish_reason, len(c.completion_ids), c.tool_calls) == ("length", 5, [])
    assert c.content == "<tool"
    assert chat_response(c, body, "x", 0)["usage"]["completion_tokens"] == 5


def test_without_capture_flags_ids_and_logprobs_are_null() -> None:
    e = engine()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    full = chat_response(e.complete(body), body, "x", 0)
    assert full["prompt_token_ids"] is None and full["choices"][0]["token_ids"] is None
    assert full["choices"][0]["logprobs"] is None
    first = next(stream_chunks(e.complete(body), body, "x", 0))
    assert "prompt_token_ids" not in first


def test_bad_requests_get_vllm_errors() -> None:
    e = engine(max_model_len=10)
    with pytest.raises(VllmError) as missing:
        e.complete({"model": "tiny", "messages": []})
    assert missing.value.status == 400
    with pytest.raises(VllmError) as too_long:
        e.complete(request([{"role": "user", "content": "x" * 20}]))
    assert too_long.value.body()["error"]["param"] == "input_tokens"
    with pytest.raises(VllmError, match="content must be a string") as bad_content:
        e.complete(request([{"role": "user", "content": 5}]))
    assert bad_content.value.status == 400
    with pytest.raises(VllmError) as unknown:
        e.complete(request(model="nope"))
    assert unknown.value.status == 404


def test_fast_tokenizer_is_prefix_stable_and_about_a_quarter_of_the_bytes() -> None:
    tok = ByteChatTokenizer(stride=4)
    history = [{"role": "system", "content": "s" * 400}, {"role": "user", "content": "u" * 400}]
    first = tok.prompt_ids(history, TOOLS)
    reply = "thinking " * 10
    completion = [*tok.encode(reply), tok.eos_id]
    second = tok.prompt_ids(
        [*history, {"role": "assistant", "content": reply}, {"role": "tool", "content": "r"}], TOOLS
    )
    assert second[: len(first) + len(completion)] == first + completion
    assert 200 <= len(first) <= 300


@pytest.mark.parametrize("stride", [1, 4])
def test_replayed_content_and_tool_calls_keep_the_prefix(stride: int) -> None:
    e = engine(stride)
    e.set_script(
        [
            ScriptedReply(
                when_last_role="user",
                content="Let me look.",
                tool_calls=[ScriptedToolCall(name="shell", arguments={"command": "ls"})],
            ),
            ScriptedReply(when_last_role="tool", content="Done: a.py"),
        ]
    )
    history: list[dict[str, Any]] = [{"role": "user", "content": "List."}]
    first = e.complete(request(history, tools=TOOLS))
    call = first.tool_calls[0]
    history += [
        {
            "role": "assistant",
            "content": first.content,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"command":"ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": "a.py"},
    ]
    second = e.complete(request(history, tools=TOOLS))
    head = first.prompt_ids + first.completion_ids
    assert second.prompt_ids[: len(head)] == head
    assert second.content == "Done: a.py"
