"""Admission control of the proxy process: past its in-flight limit a call is refused at once in the caller's own
dialect with a Retry-After (no queueing, nothing sent to the engine), and calls flow again once the slow ones end.

The engine is the scripted vLLM stand-in on loopback (real HTTP, vLLM's response shape)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harnessrl.runtime.contracts.proxy import CreateSessionRequest

from tests.fixtures.proxy_server import ProxyFactory
from tests.integration.proxy_helpers import BY_NAME, DIALECTS, assert_dialect_error, create_session, send

pytestmark = pytest.mark.timeout(60)

LIMIT = 2


@pytest.fixture(scope="module")
def slow_engine() -> Iterator[Any]:
    from tests.fakes import scripted_engine as scripted

    server = scripted.ScriptedEngineServer(scripted.ScriptedEngine(scripted.make_tokenizer("bytes"))).start()
    server.set_script([scripted.ScriptedReply(content="slow answer", when_contains="SLOW", delay_s=4.0),
                       scripted.ScriptedReply(content="Done.")])
    yield server
    server.stop()


def _inflight(url: str) -> int:
    return int(httpx.get(f"{url}/healthz", timeout=5).json()["inflight"])


def test_calls_past_the_inflight_limit_get_the_dialects_overloaded_error(
    proxy_factory: ProxyFactory, slow_engine: Any
) -> None:
    proxy = proxy_factory([slow_engine.root_url], admission={"max_inflight_calls": LIMIT, "retry_after_s": 3})
    chat = BY_NAME["openai_chat"]
    results: list[httpx.Response] = []
    engine_calls = len(slow_engine.engine.calls)
    slow = [
        threading.Thread(target=lambda sid=sid: results.append(send(proxy.url, chat, sid, chat.body("SLOW"))))
        for sid in (str(create_session(proxy.url, proxy.admin_headers)["session_id"]) for _ in range(LIMIT))
    ]
    for thread in slow:
        thread.start()
    deadline = time.monotonic() + 10
    # The proxy counts a call in flight before it reaches the engine: wait until the engine has both.
    while _inflight(proxy.url) < LIMIT or len(slow_engine.engine.calls) < engine_calls + LIMIT:
        assert time.monotonic() < deadline, "the slow calls never got in flight"
        time.sleep(0.05)
    calls_before = len(slow_engine.engine.calls)
    sid = str(create_session(proxy.url, proxy.admin_headers)["session_id"])
    for dialect in DIALECTS:
        for stream in (False, True):
            began = time.monotonic()
            response = send(proxy.url, dialect, sid, dialect.body("hi", stream=stream), stream=stream)
            assert time.monotonic() - began < 2.0  # refused at once, not queued behind the 4 s calls
            assert_dialect_error(dialect.name, response, 529 if dialect.name == "anthropic" else 503)
            assert response.headers["retry-after"] == "3"
    assert len(slow_engine.engine.calls) == calls_before  # nothing refused reached the engine
    for thread in slow:
        thread.join(timeout=15)
    assert [r.status_code for r in results] == [200] * LIMIT
    assert all("slow answer" in r.text for r in results)
    # The refusals were not charged to the session: it still answers, and its budget counts no call.
    assert send(proxy.url, chat, sid, chat.body("hi")).status_code == 200
    info = httpx.get(f"{proxy.url}/sessions/{sid}", headers=proxy.admin_headers, timeout=5).json()
    assert info["calls"] == 1
    assert "harnessrl_proxy_admission_rejected_total 8.0" in httpx.get(f"{proxy.url}/metrics", timeout=5).text



@pytest.mark.parametrize("dialect", ["openai_chat", "anthropic"])
async def test_a_stream_whose_harness_left_before_the_body_releases_its_inflight_slots(
    tmp_path: Path, slow_engine: Any, dialect: str
) -> None:
    """The harness is gone by the time the stream's headers are being written (its socket was slow, then it
    hung up): the disconnect cancels the response before the body generator ever runs, and the proxy's and the
    engine's in-flight counts must still return to 0. The app runs in-process, driven over ASGI by this test
    in the role of the server (a real server cannot be made to pause in exactly that spot); the engine is the
    scripted stand-in over loopback."""
    from harnessrl.runtime.contracts.proxy_config import ProxyConfig
    from harnessrl.runtime.proxy.app import create_app

    (tmp_path / "token").write_text("admin")
    app = create_app(ProxyConfig(upstream_urls=[slow_engine.root_url], served_model="tiny",
                                 admin_token_file=tmp_path / "token", journal_dir=tmp_path / "journal"))
    call = BY_NAME[dialect]
    async with app.admin.router.lifespan_context(app.admin):
        state = app.admin.state.proxy
        session, _ = state.store.create(CreateSessionRequest(rollout_id="r", task_id="t", harness="h", group_id="g"))
        body = json.dumps(call.body("hi", stream=True)).encode()
        incoming = [{"type": "http.request", "body": body, "more_body": False}, {"type": "http.disconnect"}]

        async def receive() -> dict[str, Any]:
            return incoming.pop(0) if len(incoming) > 1 else incoming[0]

        sent: list[str] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message["type"])
            await asyncio.sleep(0.05)  # a slow client socket: the disconnect is noticed meanwhile

        headers = [(k.encode(), v.encode()) for k, v in {"content-type": "application/json",
                                                           **call.headers(session.id)}.items()]
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": call.path, "raw_path": call.path.encode(),
                 "root_path": "", "query_string": b"", "headers": headers, "client": ("127.0.0.1", 1),
                 "server": ("127.0.0.1", 2), "state": {}}
        await asyncio.wait_for(app(scope, receive, send), timeout=20)
        assert sent == ["http.response.start"]  # the body never started
        assert state.inflight == 0
        assert [e.inflight for e in state.pool.engines] == [0]
