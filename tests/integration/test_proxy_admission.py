"""Admission control of the proxy process: past its in-flight limit a call is refused at once in the caller's own
dialect with a Retry-After (no queueing, nothing sent to the engine), and calls flow again once the slow ones end.

The engine is the scripted vLLM stand-in on loopback (real HTTP, vLLM's response shape)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fixtures.proxy_server import ProxyFactory
from tests.integration.proxy_helpers import BY_NAME, DIALECTS, assert_dialect_error, create_session, send

pytestmark = pytest.mark.timeout(60)

LIMIT = 2


@pytest.fixture(scope="module")
def slow_engine() -> Iterator[Any]:
    from harnessrl.runtime.engine import scripted

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
    slow = [
        threading.Thread(target=lambda sid=sid: results.append(send(proxy.url, chat, sid, chat.body("SLOW"))))
        for sid in (str(create_session(proxy.url, proxy.admin_headers)["session_id"]) for _ in range(LIMIT))
    ]
    for thread in slow:
        thread.start()
    deadline = time.monotonic() + 10
    while _inflight(proxy.url) < LIMIT:
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


def _engines_inflight(proxy: Any) -> list[int]:
    engines = httpx.get(f"{proxy.url}/engines", headers=proxy.admin_headers, timeout=5).json()
    return [int(e["inflight"]) for e in engines]


@pytest.mark.parametrize("dialect", ["openai_chat", "gemini"])
def test_a_stream_whose_harness_left_before_the_body_releases_its_inflight_slots(
    proxy_factory: ProxyFactory, slow_engine: Any, dialect: str
) -> None:
    """The harness gives up while the engine has not answered yet; once the engine answers, the proxy finds
    the client gone before the stream's body starts, and the proxy's and the engine's in-flight counts return
    to 0 (they leaked before: the body generator that released them never ran)."""
    proxy = proxy_factory([slow_engine.root_url])
    call = BY_NAME[dialect]
    sid = str(create_session(proxy.url, proxy.admin_headers)["session_id"])
    with pytest.raises(httpx.ReadTimeout):
        send(proxy.url, call, sid, call.body("SLOW", stream=True), stream=True, timeout=1.0)
    assert _inflight(proxy.url) == 1 and _engines_inflight(proxy) == [1]  # the engine is still on it
    deadline = time.monotonic() + 15
    while _inflight(proxy.url) or any(_engines_inflight(proxy)):
        assert time.monotonic() < deadline, f"in-flight slots leaked: {_inflight(proxy.url)}, {_engines_inflight(proxy)}"
        time.sleep(0.1)
    assert send(proxy.url, call, sid, call.body("hi", stream=True), stream=True).status_code == 200
