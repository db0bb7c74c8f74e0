"""The scripted engine's fast paths give what the plain code gave: msgspec JSON byte-identical to `json.dumps`
(or falling back to it), request decoding identical to `json.loads` (errors included), the tokenizer's per-message
memo keyed by everything a segment renders from, and the transport that sends a response's head with its body."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fakes.chat_tokenizers import ByteChatTokenizer
from tests.fakes.scripted_engine import token_logprob
from tests.fakes.vllm_wire import COMPACT, decode_json, encode_json

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES)
def test_encode_json_is_json_dumps_byte_for_byte(value: Any) -> None:
    assert encode_json(value) == json.dumps(value, separators=COMPACT).encode()


def test_encode_json_writes_every_logprob_the_engine_makes_as_json_dumps_does() -> None:
    logprobs = {token_logprob(prev, tok) for prev in range(262) for tok in range(262)}
    assert len(logprobs) == 300  # -0.01 - k/100 for k in 0..299
    payload = [{"logprob": lp, "ids": [prev, 258]} for prev, lp in enumerate(sorted(logprobs))]
    assert encode_json(payload) == json.dumps(payload, separators=COMPACT).encode()


@pytest.mark.parametrize(
    "raw",
    [b'{"a": [1, 2.5, "x\\u00e9"], "b": null}', b'{"a": NaN}', b'{"n": 123456789012345678901234567890}', b"[1, 2]"],
)
def test_decode_json_parses_as_json_loads(raw: bytes) -> None:
    got, want = decode_json(raw), json.loads(raw)
    assert json.dumps(got) == json.dumps(want)


def test_decode_json_raises_json_loads_error() -> None:
    with pytest.raises(json.JSONDecodeError) as got:
        decode_json(b'{"model": "tiny", "messages": [}')
    with pytest.raises(json.JSONDecodeError) as want:
        json.loads(b'{"model": "tiny", "messages": [}')
    assert str(got.value) == str(want.value)


def _assistant(call_id: str, command: str) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "shell", "arguments": arguments}}],
    }


def test_memoised_prompt_ids_match_a_fresh_tokenizer_and_the_memo_stays_bounded() -> None:
    tools = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
    memo = ByteChatTokenizer(stride=4, memo_size=6)
    history: list[dict[str, Any]] = [{"role": "system", "content": "s" * 40}, {"role": "user", "content": "go"}]
    for turn in range(6):
        history += [_assistant(f"call_{turn}", f"ls {turn}"), {"role": "tool", "content": f"out {turn} " * 9}]
        history.append({"role": "user", "content": [{"type": "text", "text": f"part {turn}"}]})
        assert memo.prompt_ids(history, tools) == ByteChatTokenizer(stride=4).prompt_ids(history, tools)
        assert len(memo._memo) <= 6


def test_the_memo_key_holds_what_renders_and_not_the_call_ids() -> None:
    tok = ByteChatTokenizer()
    first = tok.prompt_ids([_assistant("call_a", "ls")], None)
    assert tok.prompt_ids([_assistant("call_b", "ls")], None) == first  # ids are not rendered: one memo entry
    assert len(tok._memo) == 1
    assert tok.prompt_ids([_assistant("call_a", "pwd")], None) != first
    assert tok.prompt_ids([{"role": "user", "content": "ls"}], None) != tok.prompt_ids(
        [{"role": "system", "content": "ls"}], None
    )


def test_content_that_is_not_json_gets_the_rendering_error() -> None:
    with pytest.raises(ValueError, match="must be a string or a list of parts, not set"):
        ByteChatTokenizer().prompt_ids([{"role": "user", "content": {1, 2}}], None)
