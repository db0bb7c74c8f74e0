"""Reading vLLM's answers knowing the session's previous sequence (prompt_prefix.py): the shortcut reads exactly what
a full parse reads, on the fast path (compact JSON extending the known sequence) and on every fallback (the first
turn, spaced JSON, a rewritten history, invalid answers); and through a session, the captured turns and journal
records are those of the full parse."""

from __future__ import annotations

import json
from array import array
from typing import Any

import pytest
from harnessrl.runtime.contracts.proxy import CreateSessionRequest
from harnessrl.runtime.proxy.capture import CallCapture
from harnessrl.runtime.proxy.dialects.prompt_prefix import (
    CHUNK,
    COMPLETION,
    AnswerShape,
    KnownPrefix,
    read_answer,
)
from harnessrl.runtime.proxy.dialects.upstream import Completion
from harnessrl.runtime.proxy.sessions import SessionStore
from hypothesis import given, settings
from hypothesis import strategies as st

COMPACT = (",", ":")
SPACED = (", ", ": ")


def _answer(prompt: list[int], completion: list[int], separators: tuple[str, str] = COMPACT) -> bytes:
    """A vLLM-shaped non-streaming answer (prompt ids after the choices, as vLLM writes them)."""
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "tiny",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "ok [1,2] \"prompt_token_ids\"", "tool_calls": []},
            "logprobs": {"content": [{"token": "x", "logprob": -0.5, "bytes": [120], "top_logprobs": []}
                                     for _ in completion]},
            "finish_reason": "stop",
            "token_ids": completion,
        }],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion), "total_tokens": 0},
        "prompt_token_ids": prompt,
        "kv_transfer_params": None,
    }
    return json.dumps(body, separators=separators).encode()


def _without_ids(answer: Any) -> Any:
    if isinstance(answer, dict):  # a stream chunk
        return {k: v for k, v in answer.items() if k != "prompt_token_ids"}
    return answer.model_dump(exclude={"prompt_token_ids"})


def _known(prompt_text: bytes, prompt: list[int], completion: list[int]) -> KnownPrefix | None:
    return KnownPrefix.of(prompt_text, completion, lambda: array("i", prompt + completion))


def _same_as_full_parse(shape: AnswerShape[Any], raw: bytes, known: KnownPrefix | None) -> Any:
    answer, text, _ = read_answer(shape, raw, known)
    full = shape.parse(raw)
    ids, full_ids = shape.prompt_ids(answer), shape.prompt_ids(full)
    assert list(ids or []) == list(full_ids or [])
    assert (ids is None) == (full_ids is None)
    assert _without_ids(answer) == _without_ids(full)
    if text is not None:  # None leaves the next call to a full parse
        assert Completion.model_validate_json(b'{"prompt_token_ids":[' + text + b"]}") == Completion(
            prompt_token_ids=full_ids
        )
    return answer


def test_first_turn_is_a_full_parse_and_returns_the_prompt_text() -> None:
    raw = _answer([5, 6, 7], [8, 9])
    answer = _same_as_full_parse(COMPLETION, raw, None)
    assert answer.prompt_token_ids == [5, 6, 7]  # a plain list, as the full parse gives


def test_fast_path_reuses_the_known_ids_and_parses_only_the_new_ones() -> None:
    prompt, completion = list(range(100, 2100)), [7, 8, 9]
    _, text, _ = read_answer(COMPLETION, _answer(prompt, completion), None)
    assert text is not None
    calls: list[int] = []

    def tokens() -> array[int]:
        calls.append(1)
        return array("i", prompt + completion)

    known = KnownPrefix.of(text, completion, tokens)
    assert known is not None and known.text == ",".join(map(str, prompt + completion)).encode() + b","
    follow_up = [*prompt, *completion, 11, 12, 13]
    answer = _same_as_full_parse(COMPLETION, _answer(follow_up, [1]), known)
    assert isinstance(answer.prompt_token_ids, array) and calls == [1]


def test_prompt_equal_to_the_known_sequence() -> None:
    prompt, completion = [1, 2, 3], [4, 5]
    known = _known(b"1,2,3", prompt, completion)
    _same_as_full_parse(COMPLETION, _answer([1, 2, 3, 4, 5], [6]), known)


def test_the_known_turn_is_named_only_when_the_prompt_starts_with_all_of_it() -> None:
    prompt, completion = list(range(1000, 1500)), [1, 2]
    known = KnownPrefix.of(",".join(map(str, prompt)).encode(), completion,
                           lambda: array("i", prompt + completion), turn=4)
    assert read_answer(COMPLETION, _answer([*prompt, *completion, 9], [3]), known)[2] == 4
    assert read_answer(COMPLETION, _answer([*prompt[:300], 7, *prompt[300:]], [3]), known)[2] is None
    assert read_answer(COMPLETION, _answer([*prompt, *completion, 9], [3]), None)[2] is None


def test_rewritten_history_reuses_only_the_common_part() -> None:
    prompt, completion = list(range(1000, 1500)), [1, 2]
    known = _known(",".join(map(str, prompt)).encode(), prompt, completion)
    # Compaction or an edited earlier message: the prompt leaves the known sequence at token 300 (and inside a
    # number: 1300 became 13000, which shares the bytes "1300").
    rewritten = [*prompt[:300], 13000, *prompt[301:], 9]
    answer = _same_as_full_parse(COMPLETION, _answer(rewritten, [3]), known)
    assert isinstance(answer.prompt_token_ids, array)
    # A sub-agent's first call shares nothing: a full parse.
    other = _same_as_full_parse(COMPLETION, _answer([77, 78], [3]), known)
    assert other.prompt_token_ids == [77, 78]


def test_spaced_json_reads_the_same() -> None:
    prompt, completion = list(range(50, 90)), [3, 4]
    first_raw = _answer(prompt, completion, SPACED)
    _, text, _ = read_answer(COMPLETION, first_raw, None)
    assert text is not None
    known = _known(text, prompt, completion)
    _same_as_full_parse(COMPLETION, _answer([*prompt, *completion, 5], [1], SPACED), known)
    _same_as_full_parse(COMPLETION, _answer([*prompt, *completion, 5], [1], COMPACT), known)
    # Known text from compact JSON against a spaced answer.
    compact_known = _known(",".join(map(str, prompt)).encode(), prompt, completion)
    _same_as_full_parse(COMPLETION, _answer([*prompt, *completion, 5], [1], SPACED), compact_known)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"prompt_token_ids":[1,2,3,4,5,]}',  # trailing comma after the known part
        b'{"prompt_token_ids":[1,2,3,4,5,"x"]}',  # not an int
        b'{"prompt_token_ids":[1,2,3,4,5,6}',  # unclosed
        b'{"prompt_token_ids":[1,2,3,4,5,[6]]}',  # nested
        b'{"choices":"no","prompt_token_ids":[1,2,3,4,5,6]}',  # the rest of the answer is invalid
    ],
)
def test_invalid_answers_raise_what_the_full_parse_raises(raw: bytes) -> None:
    known = _known(b"1,2,3", [1, 2, 3], [4, 5])
    with pytest.raises(ValueError) as full:
        Completion.model_validate_json(raw)
    with pytest.raises(ValueError) as ours:
        read_answer(COMPLETION, raw, known)
    assert str(ours.value) == str(full.value)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"prompt_token_ids":null}',
        b'{"id":"a"}',
        b'{"prompt_token_ids":[]}',
        b'{"prompt_token_ids" : [ 1 , 2 , 3 , 4 , 5 , 6 ] }',
        b'{"prompt_token_ids":[1,2,3,4,5,6],"prompt_token_ids":[9]}',  # the last one wins, as in the full parse
        b'{"kv_transfer_params":{"prompt_token_ids":[1,2,3,4,5,6]}}',  # not the answer's own field
        b'{"prompt_token_ids":[1,2,3,4,5,4294967296]}',  # beyond int32: the full parse's list
        b'{"prompt_token_ids":[1,2,3,4,5,6.0,"7"]}',  # what pydantic's lax ints accept
        b'{"prompt_token_ids":[1,2,3,4,5]}',
    ],
)
def test_unusual_answers_read_as_the_full_parse_reads_them(raw: bytes) -> None:
    _same_as_full_parse(COMPLETION, raw, _known(b"1,2,3", [1, 2, 3], [4, 5]))


ids = st.lists(st.integers(0, 2**31 - 1), max_size=40)


@settings(max_examples=200, deadline=None)
@given(prompt=ids, completion=ids, keep=st.integers(0, 90), new=ids, spaced=st.booleans(), known_spaced=st.booleans())
def test_any_prompt_reads_as_the_full_parse(
    prompt: list[int], completion: list[int], keep: int, new: list[int], spaced: bool, known_spaced: bool
) -> None:
    _, text, _ = read_answer(COMPLETION, _answer(prompt, completion, SPACED if known_spaced else COMPACT), None)
    assert text is not None
    known = _known(text, prompt, completion)
    follow_up = [*(prompt + completion)[:keep], *new]
    _same_as_full_parse(COMPLETION, _answer(follow_up, [1], SPACED if spaced else COMPACT), known)


def test_stream_chunks_read_as_the_full_parse() -> None:
    prompt, completion = list(range(300, 400)), [1, 2]
    known = _known(",".join(map(str, prompt)).encode(), prompt, completion)
    first = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "tiny",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}],
             "prompt_token_ids": [*prompt, *completion, 5, 6]}
    token = {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}, "token_ids": [9],
                                     "logprobs": {"content": [{"token": "hi", "logprob": -0.1}]}}]}
    for chunk in (first, token):
        _same_as_full_parse(CHUNK, json.dumps(chunk, separators=COMPACT).encode(), known)


def _records(turns: list[tuple[list[int], list[int]]], known_prefix: bool) -> tuple[list[dict[str, Any]], Any]:
    """Play turns (prompt, completion) through a session, reading each answer with or without the shortcut."""
    store = SessionStore(default_budget=100, ttl_s=60)
    session, _ = store.create(CreateSessionRequest(rollout_id="r", task_id="t", harness="h", group_id="g"))
    records = []
    for i, (prompt, completion) in enumerate(turns):
        raw = _answer(prompt, completion)
        if known_prefix:
            capture = CallCapture(known=session.prompt_prefix)
            capture.read_completion(raw)
        else:
            capture = CallCapture.from_completion(Completion.model_validate_json(raw))
        turn = capture.to_turn(model="tiny", policy_version=i, started_at=float(i), finished_at=float(i))
        records.append(session.record_call(answered=True, turn=turn, prompt_text=capture.prompt_text, at=float(i)))
    return records, session


def test_session_records_are_those_of_the_full_parse() -> None:
    system = list(range(500, 900))
    turns = [(system, [1, 2])]
    turns.append(([*system, 1, 2, 10, 11], [3]))  # extends the last turn
    turns.append(([*system, 1, 2, 10, 11, 3, 12], [4, 5]))
    turns.append(([*system, 1, 2, 10], [6]))  # a retry-like call: a prefix of an earlier sequence
    turns.append(([*system[:100], 42], [7]))  # a sub-agent sharing the system prompt's start
    turns.append(([*system, 1, 2, 10, 11, 3, 12, 4, 5, 13], [8]))  # back on the main line
    fast, session = _records(turns, known_prefix=True)
    full, reference = _records(turns, known_prefix=False)
    for record in (*fast, *full):
        record.pop("sid")  # random per session
    assert json.dumps(fast) == json.dumps(full)
    assert [s.model_dump(exclude={"session_id"}) for s in session.sequences().sequences] == [
        s.model_dump(exclude={"session_id"}) for s in reference.sequences().sequences
    ]
    assert session.prompt_prefix is not None and reference.prompt_prefix is None
    # One known prefix per session, the latest turn's; its ids come from the call graph.
    assert session.prompt_prefix.tokens().tolist() == turns[-1][0] + turns[-1][1]
