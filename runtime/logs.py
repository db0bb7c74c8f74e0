"""One logging setup for every harnessrl program: text lines for people, or one JSON object per line for log
pipelines (`HARNESSRL_LOG_FORMAT=json`, or the operator's `--log-format json`)."""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Literal

LogFormat = Literal["text", "json"]
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMAT_ENV = "HARNESSRL_LOG_FORMAT"


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
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str | int, fmt: LogFormat | None = None) -> None:
    """Configure the root logger once, at a program's start."""
    chosen = fmt or os.environ.get(FORMAT_ENV, "text")
    if chosen not in ("text", "json"):
        raise SystemExit(f"{FORMAT_ENV}={chosen!r}: expected text or json")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if chosen == "json" else logging.Formatter(TEXT))
    logging.basicConfig(level=level.upper() if isinstance(level, str) else level, handlers=[handler], force=True)
