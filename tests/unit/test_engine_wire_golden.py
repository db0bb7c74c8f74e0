"""The scripted engine's HTTP answers, byte for byte, against answers recorded from its first implementation.

The stand-in's wire output is a contract (it answers in vLLM 0.32's exact shape, and tests across the repo read
it), so its fast paths (memoised prompt tokens, pre-encoded JSON, lean SSE writes) must not change a byte. The
golden file `test_engine_wire_golden.json` holds, per case, the status, content type and body that the original
code (plain `json.dumps` of every body and chunk, a fresh tokenisation of every prompt) gave for a multi-turn set
of requests in the shapes the proxy sends for each dialect: streamed and not, capture fields on and off, tool
calls and text, non-ASCII text, a length cut, and vLLM's errors. Random ids (`chatcmpl-<hex>`) and the `created`
clock are normalised. The requests run through the real FastAPI app (Starlette's TestClient, in process).

Regenerate only to record an intended wire change: `.venv/bin/python tests/unit/test_engine_wire_golden.py`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.fakes.scripted_engine import (
    ByteChatTokenizer,
    ScriptedEngine,
    ScriptedReply,
    ScriptedToolCall,
    create_app,
)

GOLDEN = Path(__file__).with_suffix(".json")
RANDOM_IDS = re.compile(rb"chatcmpl-(tool-)?[0-9a-f]{16}")
CREATED = re.compile(rb'"created":\d+')

SHELL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
BASH_NO_DESCRIPTION = {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}
CAPTURE: dict[str, Any] = {
    "logprobs": True,
    "top_logprobs": 0,
    "return_token_ids": True,
    "stream_options": {"include_usage": True},
}
TOOL_OUTPUT = "collected 3 items\ntests/test_parser.py::test_case FAILED\nE   assert None == 42\n" * 3

# A growing agent session, as the proxy forwards each dialect's history (OpenAI chat: content null beside tool
# calls; Anthropic: text parts; Gemini: tool results as plain text; Responses: string arguments).
SESSION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent. Use the shell tool."},
    {"role": "user", "content": "The tests fail. Fix src/parser.py."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "shell", "arguments": '{"command": "python -m pytest -q tests/"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": TOOL_OUTPUT},
    {
        "role": "assistant",
        "content": [{"type": "text", "text": "Looking at the parser."}],
        "tool_calls": [
            {"id": "call_2", "type": "function", "function": {"name": "shell", "arguments": '{"command":"cat a"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "def parse(): return None"}]},
    {"role": "user", "content": [{"type": "text", "text": "Keep going."}, {"type": "image_url", "image_url": {}}]},
]

TOOL_CALL = [ScriptedReply(tool_calls=[ScriptedToolCall(name="shell", arguments={"command": "ls -la"})])]
UNICODE = [ScriptedReply(content="Grüße 👋 — “done” \x7f tab\tnew\nline\x01 €")]
TEXT_AND_TWO_CALLS = [
    ScriptedReply(
        content="Let me look.",
        tool_calls=[
            ScriptedToolCall(name=["Bash", "shell"], arguments={"command": "grep -n 'ä' src/parser.py"}),
            ScriptedToolCall(name="shell", arguments='{"command": "pwd"}'),
            ScriptedToolCall(name="shell", arguments="not json"),
        ],
    )
]


def _cases() -> list[tuple[str, list[ScriptedReply], Any]]:
    """(name, script, request body) — a body that is not a dict is sent as raw bytes."""
    cases: list[tuple[str, list[ScriptedReply], Any]] = []
    for turns in (2, 4, 7):
        history = SESSION[:turns]
        for stream in (False, True):
            mode = "stream" if stream else "json"
            body = {"model": "tiny", "messages": history, "tools": [SHELL], "stream": stream, "max_tokens": 256}
            cases.append((f"session{turns}-{mode}-capture", TOOL_CALL, body | CAPTURE))
            cases.append((f"session{turns}-{mode}-plain", TOOL_CALL, body))
    for stream in (False, True):
        mode = "stream" if stream else "json"
        unicode_body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Käse → ok 😀"}],
            "stream": stream,
        }
        cases.append((f"unicode-{mode}", UNICODE, unicode_body | CAPTURE))
        two_calls = {
            "model": "tiny",
            "messages": SESSION[:4],
            "tools": [BASH_NO_DESCRIPTION, SHELL],
            "stream": stream,
            "max_completion_tokens": 512,
        }
        cases.append((f"two-calls-{mode}", TEXT_AND_TWO_CALLS, two_calls | CAPTURE))
        cases.append((f"two-calls-{mode}-no-usage", TEXT_AND_TWO_CALLS, two_calls | CAPTURE | {"stream_options": {}}))
        cut = {"model": "tiny", "messages": SESSION[:2], "tools": [SHELL], "stream": stream, "max_tokens": 5}
        cases.append((f"length-cut-{mode}", TOOL_CALL, cut | CAPTURE))
    cases += [
        ("error-unknown-model", TOOL_CALL, {"model": "nope", "messages": SESSION[:2]}),
        ("error-no-messages", TOOL_CALL, {"model": "tiny", "messages": []}),
        ("error-too-long", TOOL_CALL, {"model": "tiny", "messages": [{"role": "user", "content": "x" * 20000}]}),
        ("error-bad-content", TOOL_CALL, {"model": "tiny", "messages": [{"role": "user", "content": 5}]}),
        ("error-tool-not-offered", TOOL_CALL, {"model": "tiny", "messages": SESSION[:2], "tools": [BASH_NO_DESCRIPTION]}),
        ("error-not-an-object", TOOL_CALL, [1, 2]),
        ("error-invalid-json", TOOL_CALL, b'{"model": "tiny", "messages": [}'),
    ]
    return cases


def _answer(client: TestClient, engine: ScriptedEngine, script: list[ScriptedReply], body: Any) -> dict[str, Any]:
    engine.set_script(script)
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})
    raw = CREATED.sub(b'"created":0', RANDOM_IDS.sub(rb"chatcmpl-\1RANDOM", response.content))
    return {
        "status": response.status_code,
        "content_type": response.headers.get("content-type"),
        "body": raw.decode("utf-8"),
    }


# Every case with the benchmark's 4-byte tokens; the exact byte tokenizer (one chunk per byte: a big golden
# file) for the cases where splitting multi-byte characters matters.
STRIDE_CASES = {4: None, 1: {"session2-json-capture", "session2-stream-capture", "unicode-json", "unicode-stream"}}


def _cases_for(stride: int) -> list[tuple[str, list[ScriptedReply], Any]]:
    subset = STRIDE_CASES[stride]
    return [case for case in _cases() if subset is None or case[0] in subset]


CASE_NAMES = [f"stride{stride}/{case[0]}" for stride in STRIDE_CASES for case in _cases_for(stride)]


def answers() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for stride in STRIDE_CASES:
        engine = ScriptedEngine(ByteChatTokenizer(stride=stride), max_model_len=4096)
        with TestClient(create_app(engine)) as client:
            for name, script, body in _cases_for(stride):
                out[f"stride{stride}/{name}"] = _answer(client, engine, script, body)
    return out


@pytest.fixture(scope="module")
def current() -> dict[str, dict[str, Any]]:
    return answers()


@pytest.fixture(scope="module")
def golden() -> dict[str, dict[str, Any]]:
    recorded: dict[str, dict[str, Any]] = json.loads(GOLDEN.read_text(encoding="utf-8"))
    return recorded


@pytest.mark.parametrize("case", CASE_NAMES)
def test_answer_is_byte_identical_to_the_recorded_one(
    case: str, current: dict[str, dict[str, Any]], golden: dict[str, dict[str, Any]]
) -> None:
    expected, got = golden[case], current[case]
    assert (got["status"], got["content_type"]) == (expected["status"], expected["content_type"])
    assert got["body"] == expected["body"]


def test_the_golden_set_covers_every_case(golden: dict[str, dict[str, Any]]) -> None:
    assert sorted(golden) == sorted(CASE_NAMES)
    statuses = {a["status"] for a in golden.values()}
    assert statuses == {200, 400, 404}
    assert sum(a["content_type"].startswith("text/event-stream") for a in golden.values()) >= 12


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(answers(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}")
