"""Helpers shared by the proxy's integration tests: one request per dialect, and each dialect's error shape."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

BASH_TOOL = {
    "name": "bash",
    "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


@dataclass(frozen=True)
class DialectCall:
    name: str
    path: str
    key_header: str  # how the harness sends its API key

    def headers(self, key: str | None) -> dict[str, str]:
        if key is None:
            return {}
        return {self.key_header: f"Bearer {key}" if self.key_header == "authorization" else key}

    def body(self, text: str, *, stream: bool = False, tools: bool = False, **extra: Any) -> dict[str, Any]:
        if self.name == "openai_chat":
            body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": stream}
            if tools:
                body["tools"] = [{"type": "function", "function": BASH_TOOL}]
        elif self.name == "openai_responses":
            body = {"model": "m", "input": text, "stream": stream}
            if tools:
                body["tools"] = [{"type": "function", **BASH_TOOL}]
        elif self.name == "anthropic":
            body = {"model": "m", "max_tokens": 256, "messages": [{"role": "user", "content": text}], "stream": stream}
            if tools:
                body["tools"] = [{"name": "bash", "description": "Run", "input_schema": BASH_TOOL["parameters"]}]
        else:
            body = {"contents": [{"role": "user", "parts": [{"text": text}]}]}
            if tools:
                body["tools"] = [{"functionDeclarations": [BASH_TOOL]}]
        return {**body, **extra}

    def url_path(self, stream: bool = False) -> str:
        if self.name == "gemini" and stream:
            return self.path.replace(":generateContent", ":streamGenerateContent") + "?alt=sse"
        return self.path


DIALECTS = [
    DialectCall("openai_chat", "/v1/chat/completions", "authorization"),
    DialectCall("openai_responses", "/v1/responses", "authorization"),
    DialectCall("anthropic", "/v1/messages", "x-api-key"),
    DialectCall("gemini", "/v1beta/models/m:generateContent", "x-goog-api-key"),
]
BY_NAME = {d.name: d for d in DIALECTS}


def assert_dialect_error(dialect: str, response: httpx.Response, status: int) -> dict[str, Any]:
    """The response is an error with `status`, in the body shape of `dialect`'s provider."""
    assert response.status_code == status, response.text
    body = response.json()
    if dialect == "anthropic":
        assert body["type"] == "error" and isinstance(body["error"]["type"], str), body
        assert body["error"]["message"]
    elif dialect == "gemini":
        assert body["error"]["code"] == status and isinstance(body["error"]["status"], str), body
        assert body["error"]["message"]
    else:
        assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    return dict(body)


def send(base_url: str, dialect: DialectCall, key: str | None, body: dict[str, Any] | bytes,
         *, stream: bool = False, timeout: float = 30.0) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{base_url}{dialect.url_path(stream)}", content=content,
                      headers={"content-type": "application/json", **dialect.headers(key)}, timeout=timeout)


def sse_events(text: str) -> list[dict[str, Any]]:
    """The JSON payloads of an SSE body (skipping `[DONE]`)."""
    events = []
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            events.append(json.loads(line[5:]))
    return events


def create_session(proxy_url: str, admin_headers: dict[str, str], **fields: Any) -> dict[str, Any]:
    body = {"rollout_id": "r1", "task_id": "t1", "harness": "h", "group_id": "g1", **fields}
    response = httpx.post(f"{proxy_url}/sessions", headers=admin_headers, json=body, timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())
