"""The proxy process (real uvicorn, real socket) in front of the scripted engine (tests.fakes.scripted_engine, vLLM's
wire shape over loopback): sessions, auth, capture, budget, context length, constrained decoding, metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.proxy_server import ProxyProcess, start_proxy_process
from tests.fixtures.runner_token import RUNNER_TOKEN
from tests.integration.proxy_helpers import (
    BY_NAME,
    DIALECTS,
    DialectCall,
    assert_dialect_error,
    create_session,
    send,
    sse_events,
)

pytestmark = pytest.mark.timeout(60)

MAX_MODEL_LEN = 4000  # bytes tokenizer: one id per byte, so a 5,000-character message is over it


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from tests.fakes.scripted_engine import ScriptedEngine, ScriptedEngineServer, make_tokenizer

    server = ScriptedEngineServer(ScriptedEngine(make_tokenizer("bytes"), max_model_len=MAX_MODEL_LEN)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def proxy(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    process = start_proxy_process(tmp_path_factory.mktemp("proxy"), [engine.root_url], served_model="tiny")
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def _default_script(engine: Any) -> None:
    from tests.fakes.scripted_engine import ScriptedReply, ScriptedToolCall

    engine.set_script([
        # No text before the call: with text, the template re-renders "text\n" + "\n<tool_call>" and the history
        # is no longer a token prefix (as with the real Qwen template), which test_second_turn_links wants.
        ScriptedReply(tool_calls=[ScriptedToolCall(name="bash", arguments={"command": "ls"})],
                      when_tools=True, when_last_role="user"),
        ScriptedReply(content="All done: the answer is 42."),
    ])


def _session(proxy: ProxyProcess, **fields: Any) -> str:
    return str(create_session(proxy.url, proxy.admin_headers, **fields)["session_id"])


def _admin(proxy: ProxyProcess, path: str) -> httpx.Response:
    return httpx.get(f"{proxy.url}{path}", headers=proxy.admin_headers, timeout=10)


def test_admin_endpoints_need_the_admin_token_and_sessions_have_a_lifecycle(proxy: ProxyProcess) -> None:
    body = {"rollout_id": "r", "task_id": "t", "harness": "h", "group_id": "g"}
    assert httpx.post(f"{proxy.url}/sessions", json=body).status_code == 401
    assert httpx.post(f"{proxy.url}/sessions", json=body, headers={"authorization": "Bearer nope"}).status_code == 403
    assert httpx.post(f"{proxy.url}/sessions", json={"rollout_id": "r"}, headers=proxy.admin_headers).status_code == 422
    created = create_session(proxy.url, proxy.admin_headers, call_budget=7, metadata={"k": "v"})
    sid = created["session_id"]
    assert len(sid) >= 22  # token_urlsafe: >= 128 random bits
    assert created["base_url"] == proxy.url and created["dialect_base_urls"]["openai"] == f"{proxy.url}/v1"
    assert created["call_budget"] == 7 and created["model"] == "tiny"
    assert httpx.get(f"{proxy.url}/sessions/{sid}").status_code == 401
    assert httpx.get(f"{proxy.url}/sessions/{sid}/sequences", headers={"authorization": "Bearer x"}).status_code == 403
    info = _admin(proxy, f"/sessions/{sid}").json()
    assert (info["status"], info["calls"], info["turns"], info["metadata"]) == ("active", 0, 0, {"k": "v"})
    assert httpx.delete(f"{proxy.url}/sessions/{sid}").status_code == 401
    deleted = httpx.delete(f"{proxy.url}/sessions/{sid}", headers=proxy.admin_headers)
    assert deleted.json()["status"] == "closed"
    assert _admin(proxy, f"/sessions/{sid}").status_code == 404
    # A closed session's key no longer works.
    assert_dialect_error("openai_chat", send(proxy.url, BY_NAME["openai_chat"], sid, BY_NAME["openai_chat"].body("hi")), 401)


def test_the_runner_token_opens_the_session_routes_and_nothing_else(proxy: ProxyProcess) -> None:
    """A runner creates, reads and closes its sessions with the run's runner token; the captures, the policy,
    the engines and pause stay behind the admin token."""
    runner = {"authorization": f"Bearer {RUNNER_TOKEN}"}
    sid = create_session(proxy.url, runner)["session_id"]
    assert httpx.get(f"{proxy.url}/sessions/{sid}", headers=runner).json()["status"] == "active"
    for method, path in [("GET", f"/sessions/{sid}/sequences"), ("GET", f"/sessions/{sid}/turns"),
                         ("PUT", "/policy"), ("GET", "/engines"), ("POST", "/engines/drain"),
                         ("POST", "/admin/pause"), ("POST", "/admin/resume")]:
        refused = httpx.request(method, f"{proxy.url}{path}", headers=runner, json={})
        assert refused.status_code == 403 and refused.json() == {"detail": "wrong admin token"}, (method, path)
    assert httpx.delete(f"{proxy.url}/sessions/{sid}", headers=runner).json()["status"] == "closed"
    wrong = httpx.post(f"{proxy.url}/sessions", headers={"authorization": "Bearer nope"},
                       json={"rollout_id": "r", "task_id": "t", "harness": "h", "group_id": "g"})
    assert wrong.status_code == 403 and wrong.json() == {"detail": "wrong admin or runner token"}


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
@pytest.mark.parametrize("key", [None, "not-a-session"])
def test_missing_or_unknown_key_is_401_in_the_callers_dialect(proxy: ProxyProcess, dialect: DialectCall,
                                                               key: str | None) -> None:
    assert_dialect_error(dialect.name, send(proxy.url, dialect, key, dialect.body("hi")), 401)


def test_key_is_read_from_each_header_and_the_query(proxy: ProxyProcess, engine: Any) -> None:
    sid = _session(proxy)
    chat = BY_NAME["openai_chat"]
    for headers in ({"authorization": f"Bearer {sid}"}, {"x-api-key": sid}, {"x-goog-api-key": sid}):
        response = httpx.post(f"{proxy.url}/v1/chat/completions", json=chat.body("hi"), headers=headers)
        assert response.status_code == 200, response.text
    gemini = BY_NAME["gemini"]
    response = httpx.post(f"{proxy.url}/v1beta/models/m:generateContent?key={sid}", json=gemini.body("hi"))
    assert response.status_code == 200, response.text
    # Claude Code and Gemini CLI keep a path prefix from their base URL.
    response = httpx.post(f"{proxy.url}/some/prefix/v1/messages", json=BY_NAME["anthropic"].body("hi"),
                          headers={"x-api-key": sid})
    assert response.status_code == 200 and response.json()["type"] == "message"


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_capture_equals_what_the_engine_returned(proxy: ProxyProcess, engine: Any, dialect: DialectCall,
                                                 stream: bool) -> None:
    sid = _session(proxy)
    before = len(engine.engine.calls)
    response = send(proxy.url, dialect, sid, dialect.body("List the files.", stream=stream, tools=True), stream=stream)
    assert response.status_code == 200, response.text
    if stream:
        assert sse_events(response.text)
    (engine_call,) = list(engine.engine.calls)[before:]
    assert engine_call.request["logprobs"] is True and engine_call.request["return_token_ids"] is True
    (node,) = _admin(proxy, f"/sessions/{sid}/turns").json()
    turn = node["turn"]
    assert turn["prompt_ids"] == engine_call.prompt_ids
    assert turn["completion_ids"] == engine_call.completion_ids
    assert turn["logprobs"] == engine_call.logprobs
    assert turn["finish_reason"] == engine_call.finish_reason == "tool_calls"
    assert (turn["tool_calls"], turn["policy_version"], turn["model"], turn["trainable"]) == (1, 0, "tiny", True)
    info = _admin(proxy, f"/sessions/{sid}").json()
    assert (info["calls"], info["turns"], info["tool_calls"], info["bad_turns"]) == (1, 1, 1, 0)


def test_second_turn_links_to_the_first(proxy: ProxyProcess, engine: Any) -> None:
    """An OpenAI chat harness replays its history: the tool-result turn's prompt extends turn 1's
    prompt+completion, so the session is one training sequence with both completions in the loss mask."""
    sid = _session(proxy)
    chat = BY_NAME["openai_chat"]
    first_body = chat.body("List the files.", tools=True)
    first = send(proxy.url, chat, sid, first_body).json()
    message = first["choices"][0]["message"]
    call = message["tool_calls"][0]
    follow_up = {
        **first_body,
        "messages": [
            *first_body["messages"],
            {"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]},
            {"role": "tool", "tool_call_id": call["id"], "content": "a.txt\nb.txt"},
        ],
        "stream": True,
    }
    second = send(proxy.url, chat, sid, follow_up, stream=True)
    assert second.status_code == 200
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in sse_events(second.text) if e["choices"])
    assert text == "All done: the answer is 42."
    nodes = _admin(proxy, f"/sessions/{sid}/turns").json()
    assert [n["parent"] for n in nodes] == [None, 0]
    (sequence,) = _admin(proxy, f"/sessions/{sid}/sequences").json()["sequences"]
    t0, t1 = nodes[0]["turn"], nodes[1]["turn"]
    assert sequence["token_ids"] == t1["prompt_ids"] + t1["completion_ids"]
    assert sum(sequence["loss_mask"]) == len(t0["completion_ids"]) + len(t1["completion_ids"])


def test_calls_that_start_another_sequence_are_counted_by_cause(proxy: ProxyProcess, engine: Any) -> None:
    """A retry, a resent reply with other arguments (this engine serves no render endpoints, so nothing is
    spliced) and a new conversation each start one more training sequence: counted by cause on the session, its
    turns and in Prometheus."""
    sid = _session(proxy, harness="breaks-test")
    chat = BY_NAME["openai_chat"]
    first_body = chat.body("List the files.", tools=True)
    message = send(proxy.url, chat, sid, first_body).json()["choices"][0]["message"]
    assert send(proxy.url, chat, sid, first_body).status_code == 200  # the same prompt again
    (call,) = message["tool_calls"]
    edited = {**call, "function": {**call["function"], "arguments": '{"command": "pwd"}'}}
    resent = {**first_body, "messages": [*first_body["messages"], {"role": "assistant", "content": None,
                                                                   "tool_calls": [edited]},
                                         {"role": "tool", "tool_call_id": call["id"], "content": "/work"}]}
    assert send(proxy.url, chat, sid, resent).status_code == 200
    assert send(proxy.url, chat, sid, chat.body("Something else.", tools=True)).status_code == 200
    nodes = _admin(proxy, f"/sessions/{sid}/turns").json()
    assert [n["break_cause"] for n in nodes] == [None, "retry", "reply_changed", "history_changed"]
    info = _admin(proxy, f"/sessions/{sid}").json()
    assert info["prefix_breaks"] == {"retry": 1, "reply_changed": 1, "history_changed": 1}
    assert len(_admin(proxy, f"/sessions/{sid}/sequences").json()["sequences"]) == 4
    metrics = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    for cause in ("retry", "reply_changed", "history_changed"):
        assert f'harnessrl_proxy_prefix_breaks_total{{cause="{cause}",harness="breaks-test"}} 1.0' in metrics


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_call_budget_ends_the_episode_with_a_final_message(proxy: ProxyProcess, engine: Any, dialect: DialectCall,
                                                           stream: bool) -> None:
    sid = _session(proxy, call_budget=1)
    assert send(proxy.url, dialect, sid, dialect.body("hi")).status_code == 200
    before = len(engine.engine.calls)
    response = send(proxy.url, dialect, sid, dialect.body("again", stream=stream, tools=True), stream=stream)
    assert response.status_code == 200, response.text
    assert len(engine.engine.calls) == before  # answered without an engine call
    assert "budget" in response.text
    info = _admin(proxy, f"/sessions/{sid}").json()
    assert (info["status"], info["calls"], info["turns"]) == ("budget_exhausted", 2, 1)


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
def test_context_length_error_ends_the_episode_gracefully(proxy: ProxyProcess, dialect: DialectCall) -> None:
    sid = _session(proxy)
    response = send(proxy.url, dialect, sid, dialect.body("x" * (MAX_MODEL_LEN + 100)))
    assert response.status_code == 200, response.text
    assert "context length" in response.text
    info = _admin(proxy, f"/sessions/{sid}").json()
    assert info["status"] == "context_exhausted" and info["turns"] == 0
    assert any("maximum context length" in e for e in info["errors"])
    # Later calls get the same final message.
    assert "context length" in send(proxy.url, dialect, sid, dialect.body("more")).text


@pytest.mark.parametrize(
    ("dialect", "extra"),
    [
        ("openai_chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}),
        ("openai_chat", {"logit_bias": {"42": 5}}),
        ("openai_chat", {"tool_choice": "required"}),
        ("anthropic", {"tool_choice": {"type": "any"}}),
        ("gemini", {"toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}),
    ],
)
def test_training_sessions_reject_constrained_decoding(proxy: ProxyProcess, engine: Any, dialect: str,
                                                       extra: dict[str, Any]) -> None:
    call = BY_NAME[dialect]
    sid = _session(proxy)
    before = len(engine.engine.calls)
    body = assert_dialect_error(dialect, send(proxy.url, call, sid, call.body("hi", tools=True, **extra)), 400)
    assert "constrained decoding" in str(body)
    assert len(engine.engine.calls) == before
    # An evaluation session may constrain decoding.
    eval_sid = _session(proxy, training=False)
    assert send(proxy.url, call, eval_sid, call.body("hi", tools=True, **extra)).status_code == 200


def test_unknown_paths_are_404_and_models_lists_the_policy(proxy: ProxyProcess) -> None:
    response = httpx.post(f"{proxy.url}/v1/embeddings", json={})
    assert_dialect_error("openai_chat", response, 404)
    models = httpx.get(f"{proxy.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert httpx.get(f"{proxy.url}/healthz").json()["status"] == "ok"


def test_policy_switch_is_recorded_on_turns(proxy: ProxyProcess, engine: Any, tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    load = httpx.post(f"{engine.root_url}/v1/load_lora_adapter", json={"lora_name": "tiny-v1", "lora_path": str(adapter)})
    assert load.status_code == 200
    assert httpx.put(f"{proxy.url}/policy", json={"model": "tiny-v1", "version": 1}).status_code == 401
    put = httpx.put(f"{proxy.url}/policy", json={"model": "tiny-v1", "version": 1}, headers=proxy.admin_headers)
    assert put.status_code == 200
    try:
        sid = _session(proxy)
        chat = BY_NAME["openai_chat"]
        assert send(proxy.url, chat, sid, chat.body("hi")).status_code == 200
        assert engine.engine.calls[-1].model == "tiny-v1"
        (node,) = _admin(proxy, f"/sessions/{sid}/turns").json()
        assert (node["turn"]["model"], node["turn"]["policy_version"]) == ("tiny-v1", 1)
        assert _admin(proxy, f"/sessions/{sid}").json()["policy_versions"] == [1]
    finally:
        httpx.put(f"{proxy.url}/policy", json={"model": "tiny", "version": 0}, headers=proxy.admin_headers)


def test_metrics(proxy: ProxyProcess) -> None:
    sid = _session(proxy)
    chat = BY_NAME["openai_chat"]
    send(proxy.url, chat, sid, chat.body("hi"))
    text = httpx.get(f"{proxy.url}/metrics").text
    assert 'harnessrl_proxy_requests_total{dialect="openai_chat",outcome="ok"}' in text
    assert 'harnessrl_proxy_turns_total{valid="true"}' in text
    assert "harnessrl_proxy_sessions_live" in text and "harnessrl_proxy_journal_seconds_bucket" in text
