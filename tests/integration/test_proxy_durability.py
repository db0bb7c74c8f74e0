"""Durability and routing of the proxy process: rebuild from the journal after SIGKILL (byte for byte), two
engine replicas with session affinity and drain, pause/resume for weight sync, engine down, TTL expiry."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fixtures.proxy_server import ProxyFactory, ProxyProcess, start_proxy_process
from tests.integration.proxy_helpers import BY_NAME, DIALECTS, assert_dialect_error, create_session, send
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(90)


def _engine() -> Any:
    from tests.fakes.scripted_engine import (
        ScriptedEngine,
        ScriptedEngineServer,
        ScriptedReply,
        ScriptedToolCall,
        make_tokenizer,
    )

    server = ScriptedEngineServer(ScriptedEngine(make_tokenizer("bytes"))).start()
    server.set_script([
        ScriptedReply(content="slow answer", when_contains="SLOW", delay_s=1.5),
        ScriptedReply(content="never seen", when_contains="STUCK", delay_s=4),
        ScriptedReply(tool_calls=[ScriptedToolCall(name="bash", arguments={"command": "ls"})], when_tools=True,
                      when_last_role="user"),
        ScriptedReply(content="Done."),
    ])
    return server


@pytest.fixture(scope="module")
def engines() -> Iterator[list[Any]]:
    servers = [_engine(), _engine()]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def two_engine_proxy(engines: list[Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    process = start_proxy_process(tmp_path_factory.mktemp("proxy2"), [e.root_url for e in engines])
    yield process
    process.stop()


def _snapshot(proxy: ProxyProcess, sids: list[str]) -> dict[str, bytes]:
    out = {}
    for sid in sids:
        for path in (f"/sessions/{sid}", f"/sessions/{sid}/sequences", f"/sessions/{sid}/turns"):
            response = httpx.get(f"{proxy.url}{path}", headers=proxy.admin_headers, timeout=10)
            assert response.status_code == 200, response.text
            out[path] = response.content
    return out


def _wait_inflight(proxy: ProxyProcess, calls: int) -> None:
    """Until the proxy has `calls` engine calls in flight (its /healthz count)."""
    def inflight() -> int:
        return int(httpx.get(f"{proxy.url}/healthz", timeout=10).json()["inflight"])

    wait_until(lambda: inflight() == calls, 10, f"{calls} call(s) in flight at the proxy", inflight)


def _chat_turns(proxy: ProxyProcess, sid: str, turns: int, stream_every: int = 2) -> None:
    """A harness-like episode: the history (with each answer and a tool result) is replayed every call."""
    chat = BY_NAME["openai_chat"]
    body = chat.body("Fix the bug.", tools=True)
    for i in range(turns):
        stream = i % stream_every == 1
        response = send(proxy.url, chat, sid, {**body, "stream": stream}, stream=stream)
        assert response.status_code == 200, response.text
        body["messages"] = [*body["messages"], {"role": "assistant", "content": f"step {i}"},
                            {"role": "user", "content": f"tool output {i}"}]


def test_journal_rebuilds_sessions_byte_for_byte_after_sigkill(proxy_factory: ProxyFactory,
                                                               engines: list[Any]) -> None:
    proxy = proxy_factory([engines[0].root_url])
    sids = [str(create_session(proxy.url, proxy.admin_headers, rollout_id=f"r{i}")["session_id"]) for i in range(3)]
    for sid in sids:
        _chat_turns(proxy, sid, 2)
    for dialect in DIALECTS:  # one turn per dialect, streamed, in the first session
        assert send(proxy.url, dialect, sids[0], dialect.body("hi", stream=True), stream=True).status_code == 200
    chat = BY_NAME["openai_chat"]
    pending_body = chat.body("Tool call before the crash.", tools=True)
    pending = send(proxy.url, chat, sids[2], pending_body).json()["choices"][0]["message"]
    pending_id = len(httpx.get(f"{proxy.url}/sessions/{sids[2]}/turns", headers=proxy.admin_headers).json()) - 1
    closed = str(create_session(proxy.url, proxy.admin_headers)["session_id"])
    httpx.delete(f"{proxy.url}/sessions/{closed}", headers=proxy.admin_headers)
    # A call still in flight when the replica dies: its response never reached the client.
    inflight = threading.Thread(target=lambda: _swallow(lambda: send(proxy.url, chat, sids[1], chat.body("STUCK"))))
    inflight.start()
    _wait_inflight(proxy, 1)
    before = _snapshot(proxy, sids)
    proxy.kill()
    inflight.join(timeout=10)
    proxy.start()
    assert _snapshot(proxy, sids) == before
    assert httpx.get(f"{proxy.url}/sessions/{closed}", headers=proxy.admin_headers).status_code == 404
    # The rebuilt session goes on: the harness's next call (its history now holds the answer it got before the
    # crash, and the tool's result) links to that turn, rebuilt from the journal.
    follow_up = {**pending_body, "messages": [
        *pending_body["messages"],
        {"role": "assistant", "content": pending["content"], "tool_calls": pending["tool_calls"]},
        {"role": "tool", "tool_call_id": pending["tool_calls"][0]["id"], "content": "fixed"},
    ]}
    assert send(proxy.url, chat, sids[2], follow_up).status_code == 200
    nodes = httpx.get(f"{proxy.url}/sessions/{sids[2]}/turns", headers=proxy.admin_headers).json()
    assert nodes[-1]["parent"] == pending_id
    # A restart compacts the journal to the live sessions: the closed one's records are gone.
    assert closed not in (proxy.journal_dir / "proxy-0.jsonl").read_text()


def test_group_commit_holds_records_for_calls_in_flight_and_loses_nothing_at_sigkill(
        proxy_factory: ProxyFactory, engines: list[Any]) -> None:
    """Group commit (`journal_commit_delay_s`): while a slow call is in flight (the engine takes 1.5 s), the other
    sessions' records wait the delay for it before their fsync, and their responses with them; concurrent sessions
    all finish, and a SIGKILL afterwards rebuilds every turn."""
    delay = 0.3
    proxy = proxy_factory([engines[0].root_url], journal_commit_delay_s=delay)
    sids = [str(create_session(proxy.url, proxy.admin_headers, rollout_id=f"g{i}")["session_id"]) for i in range(4)]
    chat = BY_NAME["openai_chat"]
    slow = threading.Thread(target=lambda: send(proxy.url, chat, sids[0], chat.body("SLOW")))
    slow.start()
    _wait_inflight(proxy, 1)  # the slow call is at the engine
    started = time.perf_counter()
    assert send(proxy.url, chat, sids[1], chat.body("quick")).status_code == 200
    assert time.perf_counter() - started >= delay - 0.01  # held for the slow call, then synced without it
    slow.join(timeout=10)
    harnesses = [threading.Thread(target=_chat_turns, args=(proxy, sid, 3)) for sid in sids[1:]]
    for harness in harnesses:
        harness.start()
    for harness in harnesses:
        harness.join(timeout=60)
    before = _snapshot(proxy, sids)
    assert [len(json.loads(before[f"/sessions/{sid}/turns"])) for sid in sids] == [1, 4, 3, 3]
    proxy.kill()
    proxy.start()
    assert _snapshot(proxy, sids) == before


def _swallow(call: Any) -> None:
    with contextlib.suppress(httpx.HTTPError):
        call()


def test_two_engines_session_affinity_and_drain(two_engine_proxy: ProxyProcess, engines: list[Any]) -> None:
    proxy = two_engine_proxy
    sids = [str(create_session(proxy.url, proxy.admin_headers)["session_id"]) for _ in range(10)]
    owner: dict[str, int] = {}
    for sid in sids:
        counts = [len(e.engine.calls) for e in engines]
        _chat_turns(proxy, sid, 2)
        grew = [len(e.engine.calls) - c for e, c in zip(engines, counts, strict=True)]
        assert sorted(grew) == [0, 2], grew  # both turns of a session on one engine
        owner[sid] = grew.index(2)
    assert set(owner.values()) == {0, 1}  # sessions spread over both
    # Drain engine 0 while a slow call is in flight on it: the call finishes, new calls go to engine 1.
    on_zero = next(s for s, e in owner.items() if e == 0)
    chat = BY_NAME["openai_chat"]
    result: dict[str, httpx.Response] = {}
    slow = threading.Thread(target=lambda: result.setdefault("r", send(proxy.url, chat, on_zero, chat.body("SLOW"))))
    slow.start()
    _wait_inflight(proxy, 1)
    drained = httpx.post(f"{proxy.url}/engines/drain", headers=proxy.admin_headers,
                         json={"url": engines[0].root_url, "draining": True})
    assert drained.status_code == 200 and drained.json()["inflight"] == 1
    before = len(engines[0].engine.calls)
    for sid in sids:
        assert send(proxy.url, chat, sid, chat.body("more")).status_code == 200
    assert len(engines[0].engine.calls) == before
    slow.join(timeout=10)
    assert result["r"].status_code == 200 and "slow answer" in result["r"].text
    httpx.post(f"{proxy.url}/engines/drain", headers=proxy.admin_headers,
               json={"url": engines[0].root_url, "draining": False})


def test_pause_holds_new_calls_until_resume(two_engine_proxy: ProxyProcess) -> None:
    proxy = two_engine_proxy
    sid = str(create_session(proxy.url, proxy.admin_headers)["session_id"])
    chat = BY_NAME["openai_chat"]
    paused = httpx.post(f"{proxy.url}/admin/pause", headers=proxy.admin_headers, timeout=10)
    assert paused.json() == {"paused": True, "inflight": 0}
    result: dict[str, httpx.Response] = {}
    waiting = threading.Thread(target=lambda: result.setdefault("r", send(proxy.url, chat, sid, chat.body("hi"))))
    waiting.start()
    time.sleep(0.5)
    assert "r" not in result  # held, not failed
    httpx.post(f"{proxy.url}/admin/resume", headers=proxy.admin_headers)
    waiting.join(timeout=10)
    assert result["r"].status_code == 200


def test_engine_unreachable_is_an_overloaded_error_and_sessions_expire(proxy_factory: ProxyFactory) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    proxy = proxy_factory([dead], session_ttl_s=2.0)
    for dialect in DIALECTS:
        for stream in (False, True):
            sid = str(create_session(proxy.url, proxy.admin_headers)["session_id"])  # fresh: the TTL is short
            response = send(proxy.url, dialect, sid, dialect.body("hi", stream=stream), stream=stream)
            assert_dialect_error(dialect.name, response, 529 if dialect.name == "anthropic" else 503)
            assert int(response.headers["retry-after"]) >= 1
            # Counted on the session: the runner leaves a rollout that failed after this unscored.
            info = httpx.get(f"{proxy.url}/sessions/{sid}", headers=proxy.admin_headers).json()
            assert info["engine_failures"] == 1
    # Idle sessions expire after the TTL; their keys stop working.
    deadline = time.monotonic() + 15
    while httpx.get(f"{proxy.url}/sessions/{sid}", headers=proxy.admin_headers).status_code == 200:
        assert time.monotonic() < deadline, "session did not expire"
        time.sleep(0.2)
    chat = BY_NAME["openai_chat"]
    assert_dialect_error("openai_chat", send(proxy.url, chat, sid, chat.body("hi")), 401)
    assert 'harnessrl_proxy_sessions_ended_total{reason="expired"}' in httpx.get(f"{proxy.url}/metrics").text
