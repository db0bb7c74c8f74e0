"""Harness mismatch at the proxy process: each reply's tool calls are held to the tools that call offered, in all
four dialects, streamed and not. A call to a tool the harness does not have (another harness's editor) and one
whose arguments break the tool's schema are counted on the session (journaled: a SIGKILLed replica comes back with
them) and in Prometheus.

The engine is the scripted vLLM stand-in: a random tiny model would not call a chosen foreign tool on demand."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fixtures.proxy_server import ProxyFactory
from tests.integration.proxy_helpers import DIALECTS, DialectCall, create_session, send

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from tests.fakes.scripted_engine import (
        ScriptedEngine,
        ScriptedEngineServer,
        ScriptedReply,
        ScriptedToolCall,
        make_tokenizer,
    )

    server = ScriptedEngineServer(ScriptedEngine(make_tokenizer("bytes"))).start()
    server.set_script([
        ScriptedReply(when_contains="FOREIGN", tool_calls=[
            ScriptedToolCall(name="str_replace_editor", arguments={"path": "a.py"}, offered_only=False)]),
        ScriptedReply(when_contains="BADARGS", tool_calls=[ScriptedToolCall(name="bash", arguments={"cmd": 1})]),
        ScriptedReply(when_contains="FINE", tool_calls=[ScriptedToolCall(name="bash", arguments={"command": "ls"})]),
    ])
    yield server
    server.stop()


def _calls(proxy_url: str, dialect: DialectCall, sid: str, stream: bool) -> None:
    for text in ("FOREIGN", "BADARGS", "FINE"):
        response = send(proxy_url, dialect, sid, dialect.body(text, stream=stream, tools=True), stream=stream)
        assert response.status_code == 200, response.text


def _info(proxy: Any, sid: str) -> dict[str, Any]:
    return dict(httpx.get(f"{proxy.url}/sessions/{sid}", headers=proxy.admin_headers, timeout=10).json())


def test_foreign_tools_and_broken_arguments_are_counted_in_every_dialect(proxy_factory: ProxyFactory,
                                                                         engine: Any) -> None:
    proxy = proxy_factory([engine.root_url])
    sids = {}
    for dialect in DIALECTS:
        for stream in (False, True):
            sid = str(create_session(proxy.url, proxy.admin_headers, harness=f"{dialect.name}-{stream}")["session_id"])
            _calls(proxy.url, dialect, sid, stream)
            sids[(dialect.name, stream)] = sid
    for (dialect_name, stream), sid in sids.items():
        info = _info(proxy, sid)
        counts = (info["tool_calls"], info["unknown_tool_calls"], info["invalid_tool_calls"])
        assert counts == (3, 1, 1), f"{dialect_name} stream={stream}: {counts}"
    metrics = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    assert 'harnessrl_proxy_tool_mismatches_total{harness="anthropic-True",kind="unknown"} 1.0' in metrics
    assert 'harnessrl_proxy_tool_mismatches_total{harness="gemini-False",kind="invalid"} 1.0' in metrics
    # Journaled with the turn: a replica killed and restarted still holds the counts.
    proxy.kill()
    proxy.start()
    for sid in sids.values():
        info = _info(proxy, sid)
        assert (info["unknown_tool_calls"], info["invalid_tool_calls"]) == (1, 1)
