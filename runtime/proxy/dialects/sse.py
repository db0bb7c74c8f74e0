"""Server-sent events framing shared by the dialects."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic_core import to_json


def dumps(data: Any) -> str:
    """Compact JSON; non-ASCII kept as is (SSE and JSON bodies are UTF-8)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def sse_event(data: Mapping[str, Any] | str, event: str | None = None) -> bytes:
    """One SSE event. JSON never contains a raw newline, so one `data:` line suffices. Encoded by pydantic-core
    (compact, UTF-8, ~4x faster than `dumps`): a stream renders one event per token."""
    payload = data.encode() if isinstance(data, str) else to_json(data)
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + payload + b"\n\n"
