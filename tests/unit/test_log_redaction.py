"""No log line carries a bearer value (runtime/logs.py): session ids (the harness's API key), bearer tokens and
`/sessions/<id>` paths are redacted from every line, its traceback included, in both formats; httpx's
per-request INFO lines (each with the request's URL) are not written at all. The end-to-end check, on the logs of
real runner processes, is in tests/integration/test_eval_coordinator.py."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterator

import httpx
import pytest
from harnessrl.runtime import logs
from harnessrl.runtime.proxy.sessions import new_session_id

SESSION = new_session_id("run-proxy-0.run-proxy.team.svc:8081")
TOKEN = secrets.token_urlsafe(32)


@pytest.fixture
def configured() -> Iterator[None]:
    """The root logger is restored after a test configured it as a program does (logs.configure)."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, {n: logging.getLogger(n).level for n in logs.QUIET})
    yield
    root.handlers[:], root.level = saved[0], saved[1]
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize(
    "line",
    [
        f'HTTP Request: DELETE http://127.0.0.1:8080/sessions/{SESSION} "HTTP/1.1 200 OK"',
        f"closing session {SESSION}: ReadTimeout",
        f"closing session {new_session_id()}: no owner",
        f"authorization: Bearer {TOKEN}",
        "Authorization: bearer short-one",
        f"x-api-key={TOKEN}",
    ],
)
def test_bearer_values_are_redacted(line: str) -> None:
    out = logs.redact(line)
    assert logs.REDACTED in out
    for secret in (SESSION, SESSION.partition(".")[0], TOKEN, "short-one"):
        assert secret not in out


def test_what_is_not_a_secret_stays() -> None:
    line = ("rollout g0-r0001.a1-deadbeef of task vowel-08, sha 3f786850e387550fdab836ed7e6dc881de23001b, "
            "test_a_forged_key_naming_another_loopback_listener, /sessions (POST)")
    assert logs.redact(line) == line


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.usefixtures("configured")
def test_a_configured_program_writes_no_session_id(capsys: pytest.CaptureFixture[str], fmt: logs.LogFormat) -> None:
    logs.configure("DEBUG", fmt)  # its handler writes to stderr
    log = logging.getLogger("harnessrl.runner")
    # httpx's own request line, as an httpx client writes it on every call.
    transport = httpx.MockTransport(lambda request: httpx.Response(200))
    with httpx.Client(transport=transport) as client:
        client.delete(f"http://127.0.0.1:8080/sessions/{SESSION}")
    log.info("closing session %s: %s", SESSION, "ReadTimeout")
    try:
        raise httpx.ConnectError(f"cannot reach http://127.0.0.1:8080/sessions/{SESSION}")
    except httpx.ConnectError:
        log.exception("closing session failed")
    text = capsys.readouterr().err
    assert "closing session" in text and "ConnectError" in text  # the lines were written
    assert SESSION.partition(".")[0] not in text
    assert "HTTP Request" not in text  # httpx logs warnings only
    if fmt == "json":
        assert all(json.loads(line)["logger"] == "harnessrl.runner" for line in text.splitlines())
