"""Pure parts of the proxy's upstream: the body vLLM gets, error classification, engine routing, SSE splitting."""

from __future__ import annotations

import json
from typing import Any

import pytest
from harnessrl.runtime.proxy.dialects.base import CanonicalRequest, ChatMessage, DialectError
from harnessrl.runtime.proxy.engines import (
    ContextLengthExceeded,
    EngineClient,
    EnginePool,
    classify_upstream_error,
    upstream_body,
)


def _request(**extra: object) -> CanonicalRequest:
    return CanonicalRequest(model="claude-x", messages=[ChatMessage(role="user", content="hi")], **extra)


def test_upstream_body_asks_for_capture_and_neutral_sampling() -> None:
    body = upstream_body(_request(temperature=0.2, max_tokens=64, top_p=0.5, top_k=5, presence_penalty=1.5),
                         "tiny-v3", training=True, stream=True)
    assert body["model"] == "tiny-v3"
    assert body["logprobs"] is True and body["top_logprobs"] == 0 and body["return_token_ids"] is True
    assert (body["top_p"], body["top_k"], body["min_p"]) == (1.0, 0, 0.0)
    assert (body["presence_penalty"], body["frequency_penalty"], body["repetition_penalty"]) == (0.0, 0.0, 1.0)
    assert body["temperature"] == 1.0  # training: the run's temperature, not the harness's
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 64


def test_training_samples_at_the_runs_temperature_whatever_the_harness_asks() -> None:
    body = upstream_body(_request(temperature=0.2), "tiny", training=True, stream=False, temperature=0.8)
    assert body["temperature"] == 0.8


def test_upstream_body_eval_keeps_temperature_and_non_stream_has_no_stream_options() -> None:
    body = upstream_body(_request(temperature=0.2, stream_options={"include_usage": False}), "tiny",
                         training=False, stream=False)
    assert body["temperature"] == 0.2
    assert body["stream"] is False and "stream_options" not in body


@pytest.mark.parametrize(
    ("status", "raw", "expected"),
    [
        (400, b'{"error":{"message":"This model\'s maximum context length is 2048 tokens. However..."}}',
         "context"),
        (400, b'{"message":"Input length (5000) exceeds model\'s maximum context length (4096)."}',
         "context"),
        (400, b'{"error":{"message":"bad tool schema"}}', "invalid_request"),
        (503, b"busy", "overloaded"),
        # A restarted engine before the learner has loaded the policy's adapter into it again.
        (404, b'{"error":{"message":"The model `policy-v3` does not exist."}}', "overloaded"),
        (500, b"<html>oops</html>", "upstream"),
    ],
)
def test_classify_upstream_error(status: int, raw: bytes, expected: str) -> None:
    error = classify_upstream_error(status, raw, retry_after_s=3)
    if expected == "context":
        assert isinstance(error, ContextLengthExceeded)
    else:
        assert isinstance(error, DialectError) and error.kind == expected
        if expected == "overloaded":
            assert error.retry_after == 3


def test_pool_affinity_is_stable_and_draining_moves_only_that_engines_sessions() -> None:
    pool = EnginePool.from_urls(["http://e0:8000", "http://e1:8000", "http://e2:8000/"])
    sessions = [f"s{i}" for i in range(300)]
    before = {s: pool.pick(s).url for s in sessions}
    assert before == {s: pool.pick(s).url for s in sessions}
    assert len(set(before.values())) == 3  # spread over all engines
    drained = pool.get("http://e1:8000")
    assert drained is not None
    drained.draining = True
    after = {s: pool.pick(s).url for s in sessions}
    assert "http://e1:8000" not in after.values()
    assert all(after[s] == before[s] for s in sessions if before[s] != "http://e1:8000")


def test_pool_skips_engines_marked_down_and_reports_none_when_all_are_out() -> None:
    pool = EnginePool.from_urls(["http://e0", "http://e1"], )
    pool.unhealthy_for_s = 60
    for engine in pool.engines:
        pool.mark_down(engine)
    assert pool.pick("s") is None
    assert pool.pick("s", exclude=frozenset({"http://e0"})) is None


def test_upstream_body_caps_completion_tokens_when_configured() -> None:
    unlimited = upstream_body(_request(), "tiny", training=True, stream=False, max_tokens_cap=64)
    assert unlimited["max_tokens"] == 64  # a harness that sets no limit gets the cap
    smaller = upstream_body(_request(max_tokens=8), "tiny", training=True, stream=False, max_tokens_cap=64)
    assert smaller["max_tokens"] == 8
    larger = upstream_body(_request(max_tokens=4096), "tiny", training=True, stream=False, max_tokens_cap=64)
    assert larger["max_tokens"] == 64
    assert "max_tokens" not in upstream_body(_request(), "tiny", training=True, stream=False)


class _Body:
    """The part of an upstream response `EngineClient.chunks` reads: `readany`, one network read at a time."""

    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads

    async def readany(self) -> bytes:
        return self.reads.pop(0) if self.reads else b""


def _stream_bytes(n: int) -> bytes:
    first = {"choices": [{"index": 0, "delta": {"role": "assistant"}}], "prompt_token_ids": list(range(3000))}
    events = [first] + [{"choices": [{"index": 0, "delta": {"content": f"t{i}"}, "token_ids": [i]}]} for i in range(n)]
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("size", [1, 7, 64, 4096, 1 << 20])
async def test_sse_lines_split_across_reads_come_out_whole_and_in_order(size: int) -> None:
    raw = _stream_bytes(20)
    reads = [raw[i : i + size] for i in range(0, len(raw), size)]
    response: Any = _Body(reads)
    chunks = [c async for c in EngineClient.chunks(response)]
    assert chunks[0].get("prompt_token_ids") == list(range(3000))
    assert [c["choices"][0].get("token_ids") for c in chunks[1:]] == [[i] for i in range(20)]


async def test_sse_stream_without_a_final_newline_still_yields_its_last_event() -> None:
    response: Any = _Body([b'data: {"choices": []', b', "usage": {"prompt_tokens": 3}}'])
    chunks = [c async for c in EngineClient.chunks(response)]
    usage = chunks[0].get("usage") if len(chunks) == 1 else None
    assert usage is not None and usage.prompt_tokens == 3
