"""The session's HistoryMemo: a request that extends the previous one's history converts only its new items (and
EncodedMessages encodes only its new messages for the engine), and what reaches the engine is exactly what a full
parse gives (a rewritten history, another dialect or a bad item
falls back to, or reports like, a full parse)."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import pytest
from harnessrl.runtime.proxy.dialects.anthropic import AnthropicDialect
from harnessrl.runtime.proxy.dialects.base import (
    Dialect,
    DialectError,
    EncodedMessages,
    HistoryMemo,
    RouteInfo,
)
from harnessrl.runtime.proxy.dialects.gemini import GeminiDialect
from harnessrl.runtime.proxy.dialects.openai_chat import OpenAIChatDialect
from harnessrl.runtime.proxy.dialects.openai_responses import OpenAIResponsesDialect
from harnessrl.runtime.proxy.engines import upstream_body, upstream_json

OUTPUT = "FAILED tests/test_parser.py::test_case - assert None == 'x'\n" * 20


def _chat_turn(i: int) -> list[dict[str, Any]]:
    call = {"id": f"call_{i}", "type": "function", "function": {"name": "shell", "arguments": json.dumps({"n": i})}}
    return [{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": [{"type": "text", "text": f"{i}: {OUTPUT}"}]}]


def _anthropic_turn(i: int) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": [{"type": "text", "text": "Running it."},
                                              {"type": "tool_use", "id": f"toolu_{i}", "name": "shell",
                                               "input": {"n": i}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                          "content": f"{i}: {OUTPUT}"}]}]


def _gemini_turn(i: int) -> list[dict[str, Any]]:
    # No call ids, as Gemini CLI sends them: responses pair with open calls by name, across requests too.
    return [{"role": "model", "parts": [{"functionCall": {"name": "shell", "args": {"n": i}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "shell", "response": {"output": OUTPUT}}}]}]


def _responses_turn(i: int) -> list[dict[str, Any]]:
    # Text, then two calls: both calls join the assistant message of the text, across requests too.
    return [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Running."}]},
            {"type": "function_call", "call_id": f"a{i}", "name": "shell", "arguments": json.dumps({"n": i})},
            {"type": "function_call", "call_id": f"b{i}", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"a{i}", "output": OUTPUT},
            {"type": "function_call_output", "call_id": f"b{i}", "output": "ok"}]


HISTORY_KEY = {"openai_chat": "messages", "anthropic": "messages", "gemini": "contents", "openai_responses": "input"}


def _body(dialect: str, history: list[dict[str, Any]]) -> bytes:
    if dialect == "openai_responses":
        body: dict[str, Any] = {"model": "m", "instructions": "Be brief.", "input": history,
                                "tools": [{"type": "function", "name": "shell", "parameters": {}}]}
    elif dialect == "gemini":
        body = {"systemInstruction": {"parts": [{"text": "Be brief."}]}, "contents": history,
                                "tools": [{"functionDeclarations": [{"name": "shell", "parameters": {}}]}]}
    elif dialect == "openai_chat":
        body = {"model": "m", "messages": [{"role": "developer", "content": "Be brief."}, *history],
                                "tools": [{"type": "function", "function": {"name": "shell", "parameters": {}}}]}
    else:
        body = {"model": "m", "max_tokens": 64, "system": "Be brief.", "messages": history,
                "tools": [{"name": "shell", "input_schema": {"type": "object"}}]}
    return json.dumps(body).encode()


CASES: list[tuple[Dialect, Any]] = [
    (OpenAIChatDialect(), _chat_turn), (AnthropicDialect(), _anthropic_turn), (GeminiDialect(), _gemini_turn),
    (OpenAIResponsesDialect(), _responses_turn),
]


def _first(dialect: str) -> dict[str, Any]:
    if dialect == "gemini":
        return {"role": "user", "parts": [{"text": "Fix the parser."}]}
    return {"role": "user", "content": "Fix the parser."}


@pytest.mark.parametrize("step", [1, 2], ids=["one item a call", "a turn a call"])
@pytest.mark.parametrize(("dialect", "turn"), CASES, ids=lambda c: getattr(c, "name", ""))
def test_a_growing_history_parses_as_a_full_parse_would(dialect: Dialect, turn: Any, step: int) -> None:
    """One item a call puts a call and its result in different calls: state carried across the memo."""
    route = RouteInfo(dialect=dialect.name, model="m" if dialect.name == "gemini" else None)
    key = HISTORY_KEY[dialect.name]
    memo, encoded = HistoryMemo(), EncodedMessages()
    items = [_first(dialect.name)] + [item for i in range(6) for item in turn(i)]
    for n in range(1, len(items) + 1, step):
        body = _body(dialect.name, items[:n])
        assert (memo.read(dialect.name, body, key).seen > 0) == (n > 1)  # reuses the call before
        with_memo = dialect.parse_request(body, route, memo)
        full = dialect.parse_request(body, route).canonical
        assert with_memo.canonical.upstream_body() == full.upstream_body()
        # The engine's body, its messages encoded through the session's memo, is the full parse's too.
        sent = upstream_json(with_memo.canonical, "policy", encoded, training=True, stream=False)
        assert json.loads(sent) == upstream_body(full, "policy", training=True, stream=False)
        assert (encoded.reused > 0) == (n > 1)
    # A harness that rewrites its history (compaction): a dialect whose items convert independently reuses the
    # items before the first rewritten one, the others parse it whole; either way as a full parse gives it.
    rewritten = _body(dialect.name, [_first(dialect.name), *items[-2:]])
    assert memo.read(dialect.name, rewritten, key).seen == {"openai_chat": 2, "anthropic": 1}.get(dialect.name, 0)
    assert (dialect.parse_request(rewritten, route, memo).canonical.upstream_body()
            == dialect.parse_request(rewritten, route).canonical.upstream_body())


def test_the_memo_of_one_dialect_is_not_used_by_another() -> None:
    memo = HistoryMemo()
    items = [{"role": "user", "content": "hi"}]
    memo.remember("anthropic", memo.read("anthropic", _body("anthropic", items), "messages").history, [])
    longer = _body("anthropic", [*items, {"role": "user", "content": "more"}])
    assert memo.read("anthropic", longer, "messages").seen == 1
    assert memo.read("openai_chat", longer, "messages").seen == 0


def test_a_bad_new_item_is_reported_at_its_index_in_the_request() -> None:
    dialect, route, memo = OpenAIChatDialect(), RouteInfo(dialect="openai_chat"), HistoryMemo()
    history = [{"role": "user", "content": "Fix it."}, *_chat_turn(0)]
    dialect.parse_request(_body("openai_chat", history), route, memo)
    bad = [*history, {"role": "robot", "content": "?"}]
    with pytest.raises(DialectError) as err:
        dialect.parse_request(_body("openai_chat", bad), route, memo)
    assert err.value.param == "messages.4.role"  # developer + 3 history items before it
    with pytest.raises(DialectError) as full:
        dialect.parse_request(_body("openai_chat", bad), route)
    assert full.value.message == err.value.message


def test_a_too_deep_new_item_is_refused_with_a_memo_too() -> None:
    dialect, route, memo = AnthropicDialect(), RouteInfo(dialect="anthropic"), HistoryMemo()
    history: list[dict[str, Any]] = [{"role": "user", "content": "Fix it."}]
    dialect.parse_request(_body("anthropic", history), route, memo)
    deep: Any = "x"
    for _ in range(80):
        deep = {"a": deep}
    history += [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "shell", "input": deep}]}]
    with pytest.raises(DialectError, match="nested"):
        dialect.parse_request(_body("anthropic", history), route, memo)


def test_a_call_joining_a_remembered_message_leaves_the_earlier_request_as_it_was() -> None:
    dialect, route, memo = OpenAIResponsesDialect(), RouteInfo(dialect="openai_responses"), HistoryMemo()
    items = [_first("openai_responses"), *_responses_turn(0)]
    before = dialect.parse_request(_body("openai_responses", items[:2]), route, memo)  # ends with assistant text
    after = dialect.parse_request(_body("openai_responses", items[:3]), route, memo)  # + a call that joins it
    assert before.canonical.messages[-1].tool_calls is None
    assert [c.id for c in after.canonical.messages[-1].tool_calls or []] == ["a0"]


def _with_marker(message: dict[str, Any]) -> dict[str, Any]:
    """Claude Code's one sliding prompt-cache marker, on the last content block of the newest message."""
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    return {**message, "content": [*blocks[:-1], {**blocks[-1], "cache_control": {"type": "ephemeral"}}]}


def _unmarked(message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    return {**message, "content": [{"type": "text", "text": content}] if isinstance(content, str) else content}


@pytest.mark.parametrize("step", [1, 2], ids=["one item a call", "a turn a call"])
def test_a_sliding_cache_marker_reparses_only_the_item_it_left(step: int) -> None:
    """Each body moves the marker from the previous body's last message to its own: that message is resent
    changed, so the memo reuses the items before it, and the parse is still the full parse's."""
    dialect, route, memo, encoded = AnthropicDialect(), RouteInfo(dialect="anthropic"), HistoryMemo(), EncodedMessages()
    items = [_first("anthropic")] + [item for i in range(6) for item in _anthropic_turn(i)]
    previous = 0
    for n in range(1, len(items) + 1, step):
        body = _body("anthropic", [*(_unmarked(m) for m in items[: n - 1]), _with_marker(items[n - 1])])
        assert memo.read("anthropic", body, "messages").seen == max(previous - 1, 0)
        with_memo = dialect.parse_request(body, route, memo)
        full = dialect.parse_request(body, route).canonical
        assert with_memo.canonical.upstream_body() == full.upstream_body()
        sent = upstream_json(with_memo.canonical, "policy", encoded, training=True, stream=False)
        assert json.loads(sent) == upstream_body(full, "policy", training=True, stream=False)
        previous = n


def _with_tools(dialect: str, history: list[dict[str, Any]], tool_names: list[str], *, first: bool) -> bytes:
    """A body with these tools, before its history or after it (then last)."""
    body = json.loads(_body(dialect, history))
    tools = body.pop("tools")
    shape = tools[0]
    if dialect == "gemini":
        made = [{"functionDeclarations": [{**shape["functionDeclarations"][0], "name": n} for n in tool_names]}]
    elif dialect == "openai_chat":
        made = [{**shape, "function": {**shape["function"], "name": n}} for n in tool_names]
    else:
        made = [{**shape, "name": n} for n in tool_names]
    return json.dumps({"tools": made, **body} if first else {**body, "tools": made}).encode()


@pytest.mark.parametrize("tools_first", [True, False], ids=["tools before the history", "tools after it"])
@pytest.mark.parametrize(("dialect", "turn"), CASES, ids=lambda c: getattr(c, "name", ""))
def test_the_same_tools_are_validated_converted_and_encoded_once(dialect: Dialect, turn: Any, tools_first: bool) -> None:
    """Harnesses send the same tools on every call: while they are, the memo's validated tools are reused; a
    call that changes them (an MCP server came up) converts them anew. The engine's body is a full parse's."""
    route = RouteInfo(dialect=dialect.name, model="m" if dialect.name == "gemini" else None)
    memo, encoded = HistoryMemo(), EncodedMessages()
    items = [_first(dialect.name)] + [item for i in range(3) for item in turn(i)]
    names = [f"tool_{i}" for i in range(5)]
    raw, validated = [], []
    for n in range(1, len(items) + 1):
        if n == len(items) - 1:
            names = [*names, "mcp_search"]
        body = _with_tools(dialect.name, items[:n], names, first=tools_first)
        with_memo = dialect.parse_request(body, route, memo)
        full = dialect.parse_request(body, route).canonical
        sent = upstream_json(with_memo.canonical, "policy", encoded, training=True, stream=False)
        assert json.loads(sent) == upstream_body(full, "policy", training=True, stream=False)
        assert [t.function.name for t in with_memo.canonical.tools or []] == names
        assert memo.tools is not None
        raw.append(memo.tools.raw)
        validated.append(memo.tools.validated)
    # The same parsed and validated tools while they are unchanged (one copy per process: shared_tools.py).
    unchanged = [True] * (len(items) - 3) + [False, True]
    assert [now is before for before, now in pairwise(raw)] == unchanged
    assert [now is before for before, now in pairwise(validated)] == unchanged


@pytest.mark.parametrize("tools_first", [True, False], ids=["tools before the history", "tools after it"])
def test_sessions_with_the_same_tools_share_one_copy_of_them(tools_first: bool) -> None:
    """One parsed, validated and converted copy for all sessions, and each session's next body still reads its
    tools as known (the parse it holds is the shared one)."""
    route = RouteInfo(dialect="anthropic")
    sessions = [HistoryMemo() for _ in range(3)]
    names = ["read", "edit", "bash"]
    items = [_first("anthropic"), *_anthropic_turn(0), *_anthropic_turn(1)]
    for n in (1, 3, 5):
        for memo in sessions:
            body = _with_tools("anthropic", items[:n], names, first=tools_first)
            AnthropicDialect().parse_request(body, route, memo)
        kept = [memo.tools for memo in sessions]
        assert len({id(k.raw) for k in kept if k}) == len({id(k.validated) for k in kept if k}) == 1
    assert all(memo.tools is not None and memo.tools.raw is kept[0].raw for memo in sessions if kept[0])
    # Another dialect's tools convert to other objects, even when the sessions' JSON were the same.
    other = HistoryMemo()
    OpenAIChatDialect().parse_request(_with_tools("openai_chat", [_first("openai_chat")], names, first=True),
                                      RouteInfo(dialect="openai_chat"), other)
    assert other.tools is not None and kept[0] is not None and other.tools.converted is not kept[0].converted
