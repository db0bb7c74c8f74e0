"""Token splicing (runtime/trajectory/splice.py, runtime/proxy/splicing.py) per dialect and per known rewrite.

Each dialect's real parser reads a harness's follow-up request; a small ChatML-like template (special tokens 1000
and 1001, one id per character otherwise) stands in for the engine's rendering, so the test knows every token. The
sampled reply's ids are not the template's tokens of its text (`Sure` sampled as one id, re-tokenised as four),
as happens on a real engine; the vLLM test (tests/integration/test_proxy_splicing_vllm.py) shows it there."""

from __future__ import annotations

import json
from typing import Any

import pytest
from harnessrl.runtime.proxy.capture import CallCapture
from harnessrl.runtime.proxy.dialects.base import CanonicalRequest, ChatMessage
from harnessrl.runtime.proxy.dialects.routes import DIALECTS, match_route
from harnessrl.runtime.proxy.dialects.upstream import Completion
from harnessrl.runtime.proxy.splicing import HistoryKeys, generate_request
from harnessrl.runtime.trajectory.graph import SessionGraph
from harnessrl.runtime.trajectory.models import Turn
from harnessrl.runtime.trajectory.splice import Chain, reply_key, splice

START, END, SURE = 1000, 1001, 2000
TOOL = {"name": "bash", "description": "Run", "parameters": {"type": "object", "properties": {}}}
SAMPLED_TEXT = "<think>plan</think>Sure"
SAMPLED_ARGS = '{"b": [1, 2], "a": "x y"}'


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def render(messages: list[ChatMessage]) -> list[int]:
    """The toy template with the generation prompt: what the engine's render endpoint would answer."""
    out: list[int] = []
    for m in messages:
        text = m.content if isinstance(m.content, str) else "".join(p.text for p in m.content or [])
        for call in m.tool_calls or []:
            text += "\n<tool_call>" + json.dumps({"name": call.function.name,
                                                  "arguments": json.loads(call.function.arguments)})
        out += [START, *chars(f"{m.role}\n{text}"), END, *chars("\n")]
    return [*out, START, *chars("assistant\n")]


def sampled_reply() -> tuple[Completion, list[int]]:
    """The reply as the engine sampled it: thinking, `Sure` as one id, a tool call, the end token."""
    ids = [*chars("<think>plan</think>"), SURE, *chars(f'\n<tool_call>{{"name": "bash", "arguments": {SAMPLED_ARGS}}}'),
           END]
    completion = Completion.model_validate({"choices": [{
        "message": {"role": "assistant", "content": SAMPLED_TEXT,
                    "tool_calls": [{"id": "c1", "function": {"name": "bash", "arguments": SAMPLED_ARGS}}]},
        "finish_reason": "tool_calls", "token_ids": ids}]})
    return completion, ids


def request(dialect: str, user: str, reply: tuple[str, str] | None = None) -> CanonicalRequest:
    """A harness's call in `dialect`: the first one, or (with `reply`: its text and tool arguments as the
    harness resends them) the follow-up with the tool's result, parsed by the dialect's own parser."""
    if dialect == "openai_chat":
        path, messages = "/v1/chat/completions", [{"role": "user", "content": user}]
        if reply:
            messages += [{"role": "assistant", "content": reply[0], "tool_calls": [
                             {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": reply[1]}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}]
        body: dict[str, Any] = {"model": "m", "messages": messages, "tools": [{"type": "function", "function": TOOL}]}
    elif dialect == "openai_responses":
        path, items = "/v1/responses", [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": user}]}]
        if reply:
            items += [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": reply[0]}]},
                      {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": reply[1]},
                      {"type": "function_call_output", "call_id": "c1", "output": "a.txt"}]
        body = {"model": "m", "input": items, "tools": [{"type": "function", **TOOL}]}
    elif dialect == "anthropic":
        path, messages = "/v1/messages", [{"role": "user", "content": user}]
        if reply:
            messages += [{"role": "assistant", "content": [
                             {"type": "thinking", "thinking": "plan", "signature": "s"}, {"type": "text", "text": reply[0]},
                             {"type": "tool_use", "id": "c1", "name": "bash", "input": json.loads(reply[1])}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "a.txt"}]}]
        body = {"model": "m", "max_tokens": 10, "messages": messages,
                "tools": [{"name": "bash", "input_schema": TOOL["parameters"]}]}
    else:
        path, contents = "/v1beta/models/g:generateContent", [{"role": "user", "parts": [{"text": user}]}]
        if reply:
            contents += [{"role": "model", "parts": [{"text": reply[0]},
                                                     {"functionCall": {"name": "bash", "args": json.loads(reply[1])}}]},
                         {"role": "user", "parts": [{"functionResponse": {"name": "bash", "response": {"output": "a.txt"}}}]}]
        body = {"contents": contents, "tools": [{"functionDeclarations": [{"name": "bash", "parameters": {"type": "OBJECT"}}]}]}
    route = match_route(path)
    assert route is not None
    return DIALECTS[route.dialect].parse_request(json.dumps(body).encode(), route).canonical


def first_turn(dialect: str) -> tuple[SessionGraph, list[int], int]:
    """A session whose first call was answered with the sampled reply: its graph, prompt + sampled ids, and the
    prompt's length."""
    completion, ids = sampled_reply()
    prompt = render(request(dialect, "List files.").messages)
    capture = CallCapture.from_completion(completion)
    capture.prompt_ids, capture.logprobs = prompt, [-0.5] * len(ids)
    graph = SessionGraph("s")
    graph.add(capture.to_turn(model="m", policy_version=0, started_at=0.0, finished_at=0.0))
    return graph, prompt + ids, len(prompt)


def follow_up(graph: SessionGraph, canonical: CanonicalRequest) -> tuple[list[int], int | None]:
    """What the proxy sends for a follow-up (spliced when the history repeats a reply), and its parent."""
    rendered = render(canonical.messages)
    chain = graph.chain_for(HistoryKeys().keys(canonical))
    spliced = splice(rendered, chain, END) if chain is not None else None
    prompt = spliced.tokens.tolist() if spliced is not None else rendered
    node = graph.add(Turn(prompt_ids=prompt, completion_ids=[7, END], logprobs=[-1.0, -1.0]))
    return prompt, node.parent


DIALECT_NAMES = ["openai_chat", "openai_responses", "anthropic", "gemini"]
# Rewrites harnesses make of their own reply: text, tool arguments. Each keeps the chain.
REWRITES = {
    "as sent": (SAMPLED_TEXT, SAMPLED_ARGS),
    "stripped thinking": ("Sure", SAMPLED_ARGS),
    "re-serialised tool arguments": (SAMPLED_TEXT, '{"b":[1,2],"a":"x y"}'),
    "reordered JSON keys": ("  Sure\n", '{"a": "x y", "b": [1, 2]}'),
}


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
@pytest.mark.parametrize("rewrite", list(REWRITES))
def test_a_rewritten_reply_is_spliced_back_and_the_chain_stays_one_sequence(dialect: str, rewrite: str) -> None:
    graph, earlier, reply_at = first_turn(dialect)
    canonical = request(dialect, "List files.", REWRITES[rewrite])
    rendered = render(canonical.messages)
    # The template's tokens of the resent reply are not what was sampled (re-tokenised text: `Sure` is one id).
    assert rendered[: len(earlier)] != earlier
    prompt, parent = follow_up(graph, canonical)
    assert prompt[: len(earlier)] == earlier and parent == 0
    # After the reply, the rendering's own tokens: the tool result and the generation prompt.
    assert prompt[len(earlier):] == rendered[rendered.index(END, reply_at) + 1:]
    (sequence,) = graph.training_sequences()
    assert sequence.node_ids == [0, 1]


def test_an_acknowledgement_the_harness_wrote_before_the_first_reply_is_context() -> None:
    """Qwen Code and Gemini CLI open their history with a canned model turn ("Got it. Thanks for the context!")
    that the engine never sampled: the path of replies starts after it, and the follow-up is spliced."""
    preamble = [{"role": "user", "content": "Context: a.txt"}, {"role": "assistant", "content": "Got it."}]
    (route, body) = match_route("/v1/chat/completions"), {"model": "m", "tools": [{"type": "function", "function": TOOL}]}
    assert route is not None

    def parse(messages: list[dict[str, Any]]) -> CanonicalRequest:
        raw = json.dumps(body | {"messages": [*preamble, {"role": "user", "content": "List files."}, *messages]})
        return DIALECTS[route.dialect].parse_request(raw.encode(), route).canonical

    completion, ids = sampled_reply()
    capture = CallCapture.from_completion(completion)
    capture.prompt_ids, capture.logprobs = render(parse([]).messages), [-0.5] * len(ids)
    graph = SessionGraph("s")
    graph.add(capture.to_turn(model="m", policy_version=0, started_at=0.0, finished_at=0.0))
    earlier = [*capture.prompt_ids, *ids]
    resent = parse([{"role": "assistant", "content": "Sure", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": SAMPLED_ARGS}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}])
    # Keyed from the first message on, the acknowledgement hides the session's reply; as context, it does not.
    assert graph.chain_for(HistoryKeys().keys(resent)) is None
    keys = HistoryKeys().keys(resent, graph.has_chain)
    chain = graph.chain_for(keys)
    assert chain is not None and keys[0] == b""
    spliced = splice(render(resent.messages), chain, END)
    assert spliced is not None and spliced.tokens.tolist()[: len(earlier)] == earlier
    assert graph.add(Turn(prompt_ids=spliced.tokens.tolist(), completion_ids=[7], logprobs=[-1.0])).parent == 0


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
def test_an_edited_reply_is_not_spliced_and_branches(dialect: str) -> None:
    graph, _, _ = first_turn(dialect)
    canonical = request(dialect, "List files.", ("Sure, and more", SAMPLED_ARGS))
    assert graph.chain_for(HistoryKeys().keys(canonical)) is None
    prompt, parent = follow_up(graph, canonical)
    assert prompt == render(canonical.messages) and parent is None
    assert len(graph.training_sequences()) == 2


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
def test_an_edited_earlier_user_message_starts_a_new_root(dialect: str) -> None:
    graph, _, _ = first_turn(dialect)
    canonical = request(dialect, "List all files.", REWRITES["stripped thinking"])
    assert graph.chain_for(HistoryKeys().keys(canonical)) is not None  # the reply is the session's ...
    prompt, parent = follow_up(graph, canonical)  # ... but what came before it changed
    assert prompt == render(canonical.messages) and parent is None
    assert len(graph.training_sequences()) == 2


def test_only_the_replies_before_an_edited_tool_result_are_spliced() -> None:
    """Two replies; the harness changed the tool result between them: the first is spliced, the second is sent
    as rendered, and the call branches from the first turn."""
    s, e = chars("ab"), chars("cd")
    ctx0, ctx1 = [START, 1, END, START, 2], [3, START, 2]  # the first reply closes with END (sampled)
    tokens = [*ctx0, *s, END, *ctx1, *e, END]
    chain = Chain(tokens, [(len(ctx0), len(ctx0) + 3), (len(ctx0) + 3 + len(ctx1), len(tokens))])
    rendered = [*ctx0, *chars("a b"), END, 4, START, 2, *chars("c d"), END, 9]
    spliced = splice(rendered, chain, END)
    assert spliced is not None and spliced.replies == 1
    assert spliced.tokens.tolist() == [*ctx0, *s, END, 4, START, 2, *chars("c d"), END, 9]


def test_a_reply_cut_at_the_token_limit_is_closed_as_the_template_closes_it() -> None:
    ctx0 = [START, 1, END, START, 2]
    cut = chars("abc")  # no end token: the engine stopped at max_tokens
    chain = Chain([*ctx0, *cut], [(len(ctx0), len(ctx0) + 3)])
    rendered = [*ctx0, *chars("a bc"), END, 5, START, 2]
    spliced = splice(rendered, chain, END)
    assert spliced is not None and spliced.tokens.tolist() == [*ctx0, *cut, END, 5, START, 2]


def test_nothing_is_spliced_where_the_rendering_has_no_end_of_turn() -> None:
    ctx0 = [START, 1, END, START, 2]
    chain = Chain([*ctx0, 7, END], [(len(ctx0), len(ctx0) + 2)])
    assert splice([*ctx0, 7, 8], chain, END) is None


def test_reply_keys_ignore_what_harnesses_rewrite_and_see_what_they_change() -> None:
    base = reply_key("<think>x</think> Hello  world", [("f", '{"a": 1, "b": {"c": 2}}')])
    assert reply_key("Hello world", [("f", '{"b":{"c":2},"a":1}')]) == base
    assert reply_key("Hello world!", [("f", '{"a": 1, "b": {"c": 2}}')]) != base
    assert reply_key("Hello world", [("f", '{"a": 2, "b": {"c": 2}}')]) != base
    assert reply_key("Hello world", [("g", '{"a": 1, "b": {"c": 2}}')]) != base
    assert reply_key("Hello world", []) != base


def test_the_generate_request_keeps_prompt_and_budget_within_the_context() -> None:
    rendered = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 10, "temperature": 1.0}, "stream": True}
    request_ = generate_request(rendered, [1, 2, 3, 4, 5])
    assert request_["token_ids"] == [1, 2, 3, 4, 5] and request_["sampling_params"]["max_tokens"] == 8
    assert request_["stream"] is False and request_["return_token_ids"] is True
    assert rendered["sampling_params"]["max_tokens"] == 10  # the rendered request is left as it was


def test_history_keys_key_only_the_replies_a_call_appends() -> None:
    from harnessrl.runtime.proxy.dialects.base import ChatMessage, FunctionCall, ToolCall

    def reply(i: int) -> ChatMessage:
        return ChatMessage(role="assistant", content=f"step {i}",
                           tool_calls=[ToolCall(id=f"c{i}", function=FunctionCall(name="bash", arguments="{}"))])

    history = [ChatMessage(role="user", content="go")]
    memo = HistoryKeys()
    for i in range(4):  # each call resends the same message objects and appends one reply and a tool result
        history = [*history, reply(i), ChatMessage(role="tool", content="ok", tool_call_id=f"c{i}")]
        request = CanonicalRequest(model="m", messages=history)
        assert memo.keys(request) == HistoryKeys().keys(request)
    # A rewritten reply (a new object with other text) is keyed anew, and so is every path after it.
    history[3] = ChatMessage(role="assistant", content="edited")
    request = CanonicalRequest(model="m", messages=history)
    keys = memo.keys(request)
    assert keys == HistoryKeys().keys(request) and keys[0] == HistoryKeys().keys(
        CanonicalRequest(model="m", messages=history[:2]))[0]
