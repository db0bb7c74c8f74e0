"""One logging setup for every harnessrl program: text lines for people, or one JSON object per line for log
pipelines (`HARNESSRL_LOG_FORMAT=json`, or the operator's `--log-format json`).

No line carries a bearer value. A session id is the harness's API key at the proxy, and it travels in URL paths
(`/sessions/{id}`): httpx's one INFO line per request put it in 592 lines of one quickstart run's runner log. So
httpx and httpcore log only warnings, and every line is redacted on its way out (`redact`, the traceback
included): session ids, bearer tokens and `/sessions/<id>` path segments become `<redacted>`."""

from __future__ import annotations

import json
import logging
import os
import re
from datetime import UTC, datetime
from typing import Literal

LogFormat = Literal["text", "json"]
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMAT_ENV = "HARNESSRL_LOG_FORMAT"
REDACTED = "<redacted>"
# Loggers that name every request's URL at INFO.
QUIET = ("httpx", "httpcore")
_SECRET = re.compile(
    # Neither runs over a backslash: in a JSON line, a quote after a value is escaped.
    r"(?<=[Bb]earer )[^\s\"',\\]+"  # an Authorization value
    r"|(?<=/sessions/)[^/\s\"'?#\\]+"  # a session id in a URL or a path
    # A token from `secrets.token_urlsafe` (a session id: 32 such characters, then its owner's `.host:port`; a
    # run's tokens: 43): 32 or more URL-safe characters with upper and lower case (hex digests have no capitals).
    r"|(?<![\w-])(?=[\w-]*[A-Z])(?=[\w-]*[a-z])[\w-]{32,}(?:\.[\w.\[\]:-]*:\d+)?"
)


def redact(text: str) -> str:
    """`text` with every bearer value in it replaced by REDACTED."""
    return _SECRET.sub(REDACTED, text)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """time, level, logger, message (and the traceback as `exception`): the fields log pipelines index."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return redact(json.dumps(entry, ensure_ascii=False))


def configure(level: str | int, fmt: LogFormat | None = None) -> None:
    """Configure the root logger once, at a program's start."""
    chosen = fmt or os.environ.get(FORMAT_ENV, "text")
    if chosen not in ("text", "json"):
        raise SystemExit(f"{FORMAT_ENV}={chosen!r}: expected text or json")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter(TEXT))
    logging.basicConfig(level=level.upper() if isinstance(level, str) else level, handlers=[handler], force=True)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
