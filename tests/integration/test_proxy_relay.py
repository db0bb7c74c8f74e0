"""A call that reaches a replica other than its session's owner is relayed to the owner (runtime/proxy/relay.py), as
it is when a harness in an E2B sandbox calls the proxy's one public URL: two real `harnessrl proxy` replicas on
127.0.0.1 in front of the scripted engine (vLLM's HTTP API). Every dialect, streamed and not, is answered through the
other replica and captured by the owner; an owner that is down gets the dialect's retryable overloaded error; a key
naming an address outside the proxy is refused, and so is one naming another listener on the proxy's own host (the
attack: a sandboxed harness whose only way out is the proxy forging `<random>.127.0.0.1:<port>` to reach the
coordinator or any loopback-only service through it)."""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.fixtures.proxy_server import ProxyFactory
from tests.integration.proxy_helpers import DIALECTS, assert_dialect_error, send

pytestmark = pytest.mark.timeout(120)


def _session(url: str, headers: dict[str, str]) -> dict[str, Any]:
    body = {"rollout_id": "r", "task_id": "t", "harness": "h", "group_id": "g"}
    response = httpx.post(f"{url}/sessions", json=body, headers=headers, timeout=10)
    response.raise_for_status()
    return dict(response.json())


def _without_ids(text: str) -> str:
    return re.sub(r"[A-Za-z0-9_-]{16,}|\d+", "#", text)


class Listener:
    """A loopback HTTP service that is not the proxy (the coordinator, say): records every request it gets."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                listener.requests.append(self.path)
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_forged_key_naming_another_loopback_listener_is_not_relayed(
        proxy_factory: ProxyFactory, scripted_engine_factory: Callable[..., Any]) -> None:
    engine = scripted_engine_factory(tokenizer="bytes")
    listener = Listener()
    try:
        proxy = proxy_factory([engine.root_url], workers=2)
        for url in (proxy.url, *proxy.worker_urls):
            for dialect in DIALECTS:
                forged = f"{'x' * 32}.127.0.0.1:{listener.port}"
                answer = send(url, dialect, forged, dialect.body("reach the coordinator"))
                assert_dialect_error(dialect.name, answer, 401)
        assert listener.requests == []  # nothing of the harness's call reached it
    finally:
        listener.close()


def test_calls_at_another_replica_are_relayed_to_the_owner(proxy_factory: ProxyFactory,
                                                          scripted_engine_factory: Callable[..., Any]) -> None:
    from tests.fakes.scripted_engine import ScriptedReply

    engine = scripted_engine_factory(tokenizer="bytes")
    engine.set_script([ScriptedReply(content="Done.")])
    owner = proxy_factory([engine.root_url], replica_id="proxy-0")
    # Replicas on one host serve at different ports: each names the other's (in a cluster they share them).
    other = proxy_factory([engine.root_url], replica_id="proxy-1", relay_ports=[owner.port])
    sid = _session(owner.url, owner.admin_headers)["session_id"]
    assert sid.endswith(f".127.0.0.1:{owner.port}")  # the id names its owner

    calls = 0
    for dialect in DIALECTS:
        for stream in (False, True):
            body = dialect.body("Fix the bug.", stream=stream)
            straight = send(owner.url, dialect, sid, body, stream=stream)
            relayed = send(other.url, dialect, sid, body, stream=stream)
            calls += 2
            assert (straight.status_code, relayed.status_code) == (200, 200), relayed.text
            assert relayed.headers["content-type"] == straight.headers["content-type"]
            # The same answer but for its ids and times: the owner's, passed on as it is.
            assert _without_ids(relayed.text) == _without_ids(straight.text), (dialect.name, stream)
    info = httpx.get(f"{owner.url}/sessions/{sid}", headers=owner.admin_headers, timeout=10).json()
    assert (info["calls"], info["turns"], info["errors"]) == (calls, calls, [])  # captured by the owner
    assert httpx.get(f"{other.url}/sessions/{sid}", headers=other.admin_headers, timeout=10).status_code == 404

    # A key naming an address outside this proxy is refused (relay_address decides without connecting).
    refused = send(other.url, DIALECTS[0], f"{'x' * 32}.proxy.example.com:443", DIALECTS[0].body("hi"))
    assert_dialect_error("openai_chat", refused, 401)

    # The owner down: the caller's dialect's retryable error, with Retry-After.
    owner.stop()
    for dialect in DIALECTS:
        down = send(other.url, dialect, sid, dialect.body("again"))
        assert_dialect_error(dialect.name, down, 529 if dialect.name == "anthropic" else 503)
        assert down.headers["retry-after"] == "2" and "unreachable" in down.text
