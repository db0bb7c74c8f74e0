"""Bad input to the proxy: malformed JSON, wrong types, oversized bodies, unknown paths, missing keys. Each gets
the right status and an error body in the caller's dialect, and the proxy keeps serving. The proxy app runs under
uvicorn on 127.0.0.1 (in a thread of this process), in front of the scripted engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.proxy_server import serve_in_thread
from tests.integration.proxy_helpers import BY_NAME, DIALECTS, DialectCall, assert_dialect_error, send

pytestmark = pytest.mark.timeout(120)

MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def proxy_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from harnessrl.runtime.contracts.proxy_config import ProxyConfig
    from harnessrl.runtime.proxy.app import create_app

    from tests.fakes.scripted_engine import ScriptedEngine, ScriptedEngineServer, make_tokenizer

    engine = ScriptedEngineServer(ScriptedEngine(make_tokenizer("bytes"))).start()
    workdir: Path = tmp_path_factory.mktemp("proxy")
    (workdir / "admin").write_text("admin-secret")
    config = ProxyConfig(
        upstream_urls=[engine.root_url],
        served_model="tiny",
        admin_token_file=workdir / "admin",
        journal_dir=workdir / "journal",
        max_body_bytes=MAX_BODY,
        journal_fsync=False,  # many small calls; durability is tested elsewhere
    )
    server, thread, url = serve_in_thread(create_app(config))
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.stop()


@pytest.fixture(scope="module")
def session_id(proxy_url: str) -> str:
    response = httpx.post(f"{proxy_url}/sessions", headers={"authorization": "Bearer admin-secret"},
                          json={"rollout_id": "r", "task_id": "t", "harness": "h", "group_id": "g", "call_budget": 10_000})
    return str(response.json()["session_id"])


def _still_serves(proxy_url: str, session_id: str) -> None:
    chat = BY_NAME["openai_chat"]
    assert send(proxy_url, chat, session_id, chat.body("hi")).status_code == 200


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[1, 2, 3]", b"", b"\xff\xfe", b'"a string"', b"null"],
    ids=["broken", "array", "empty", "not-utf8", "string", "null"],
)
def test_malformed_json_is_400_in_the_dialect(proxy_url: str, session_id: str, dialect: DialectCall,
                                              body: bytes) -> None:
    assert_dialect_error(dialect.name, send(proxy_url, dialect, session_id, body), 400)


WRONG_TYPES = {
    "openai_chat": [{"model": "m", "messages": "hi"}, {"model": "m", "messages": [{"role": 5}]},
                    {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}],
    "openai_responses": [{"model": "m", "input": 5}, {"model": "m", "input": [{"role": "user", "content": 7}]}],
    "anthropic": [{"model": "m", "max_tokens": 10, "messages": {"role": "user"}},
                  {"model": "m", "max_tokens": "x", "messages": [{"role": "user", "content": "hi"}]}],
    "gemini": [{"contents": "hi there"}, {"contents": [{"role": "user", "parts": [{"text": 5}]}]}],
}


@pytest.mark.parametrize(("name", "body"), [(n, b) for n, bodies in WRONG_TYPES.items() for b in bodies])
def test_wrong_types_are_400_in_the_dialect(proxy_url: str, session_id: str, name: str, body: dict[str, Any]) -> None:
    assert_dialect_error(name, send(proxy_url, BY_NAME[name], session_id, body), 400)


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
def test_oversized_bodies_are_413_declared_or_chunked(proxy_url: str, session_id: str, dialect: DialectCall) -> None:
    big = dialect.body("x" * (MAX_BODY + 10))
    assert_dialect_error(dialect.name, send(proxy_url, dialect, session_id, big), 413)
    data = json.dumps(big).encode()

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
        for i in range(0, len(data), 8192):
            yield data[i : i + 8192]

    response = httpx.post(f"{proxy_url}{dialect.path}", content=chunks(), headers=dialect.headers(session_id))
    assert_dialect_error(dialect.name, response, 413)
    _still_serves(proxy_url, session_id)


@pytest.mark.parametrize(
    ("path", "dialect"),
    [("/v1/embeddings", "openai_chat"), ("/v1/completions", "openai_chat"), ("/v2/messages", "openai_chat"),
     ("/v1beta/models/m:embedContent", "openai_chat"), ("/v1/messages/batches", "openai_chat")],
)
def test_unknown_paths_are_404(proxy_url: str, session_id: str, path: str, dialect: str) -> None:
    response = httpx.post(f"{proxy_url}{path}", json={}, headers={"authorization": f"Bearer {session_id}"})
    assert_dialect_error(dialect, response, 404)


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
def test_missing_key_is_401_even_with_a_bad_body(proxy_url: str, dialect: DialectCall) -> None:
    assert_dialect_error(dialect.name, send(proxy_url, dialect, None, b"{broken"), 401)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def mutated_request(draw: st.DrawFn) -> tuple[DialectCall, dict[str, Any] | Any, bool]:
    """A valid request of a random dialect with one field replaced, added or removed, or any JSON at all."""
    dialect = draw(st.sampled_from(DIALECTS))
    stream = draw(st.booleans())
    body: Any = dialect.body(draw(st.text(max_size=30)), stream=stream, tools=draw(st.booleans()))
    action = draw(st.sampled_from(["replace", "add", "remove", "anything"]))
    if action == "anything":
        body = draw(JSON)
    elif action == "remove":
        body.pop(draw(st.sampled_from(sorted(body))))
    else:
        key = draw(st.sampled_from(sorted(body))) if action == "replace" else draw(st.text(max_size=12))
        body[key] = draw(JSON)
    return dialect, body, stream


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=mutated_request())
def test_fuzzed_requests_get_a_dialect_answer_never_a_500(proxy_url: str, session_id: str,
                                                          case: tuple[DialectCall, Any, bool]) -> None:
    dialect, body, stream = case
    response = send(proxy_url, dialect, session_id, json.dumps(body).encode(), stream=stream)
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert_dialect_error(dialect.name, response, response.status_code)


def test_still_serving_after_the_fuzz(proxy_url: str, session_id: str) -> None:
    _still_serves(proxy_url, session_id)
    info = httpx.get(f"{proxy_url}/sessions/{session_id}", headers={"authorization": "Bearer admin-secret"}).json()
    assert info["status"] == "active" and info["errors"]  # the refusals were recorded, the session lives on
