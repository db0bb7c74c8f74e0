"""Server-sent events framing shared by the dialects."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def dumps(data: Any) -> str:
    """Compact JSON; non-ASCII kept as is (SSE and JSON bodies are UTF-8)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def sse_event(data: Mapping[str, Any] | str, event: str | None = None) -> bytes:
    """One SSE event. JSON never contains a raw newline, so one `data:` line suffices."""
    payload = data if isinstance(data, str) else dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()
