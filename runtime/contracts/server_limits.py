"""The limits every server of harnessrl puts on a connection before its request is known (a config part of the
proxy's and the runner's configs; runtime/serving.py applies them). Pydantic only: the operator renders it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ServerLimits(BaseModel):
    """What one connection may cost a server before its request is known."""

    model_config = ConfigDict(extra="forbid")

    # A request line and headers larger than this are refused (431). Harness CLIs send a few KB.
    max_head_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
    # A request's head must be whole this long after its first byte (or after the connection opened).
    head_timeout_s: float = Field(30.0, gt=0, le=3600)
    # A request's body must be whole this long after its head (408), and no larger than this (413), whether or not
    # the server reads it. A server taking larger bodies (the proxy's calls, the adapter store's uploads) raises them.
    body_timeout_s: float = Field(60.0, gt=0, le=3600)
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    # An idle kept-alive connection is closed after this long.
    keep_alive_s: int = Field(75, ge=1, le=3600)
