"""Wire formats of the proxy's admin/control HTTP API (the dialect surfaces are in dialects/).

POST /sessions            CreateSessionRequest -> CreateSessionResponse   (admin bearer token)
GET /sessions/{id}        -> SessionInfo                                  (admin)
GET /sessions/{id}/sequences -> SequencesResponse                         (admin)
GET /sessions/{id}/turns  -> list of trajectory Node (the captured call graph)   (admin)
DELETE /sessions/{id}     -> SessionInfo (final state)                    (admin)
GET/PUT /policy           PolicyState                                     (PUT: admin)
GET /engines, POST /engines/drain, POST /admin/pause, POST /admin/resume  (admin; see README.md)
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import httpx
from harnessrl.runtime.contracts.client import bearer, reply
from harnessrl.runtime.trajectory.models import BreakCause, TrainingSequence
from pydantic import BaseModel, ConfigDict, Field

SESSIONS_PATH = "/sessions"
SESSION_PATH = "/sessions/{session_id}"
SEQUENCES_PATH = "/sessions/{session_id}/sequences"
POLICY_PATH = "/policy"

Id = Annotated[str, Field(min_length=1, max_length=256)]


class CreateSessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rollout_id: Id
    task_id: Id
    harness: Id
    group_id: Id
    # Max model calls for this episode; None = the proxy's default. Beyond it the harness gets a final message.
    call_budget: int | None = Field(None, ge=1, le=100_000)
    # Training sessions reject constrained decoding (it changes the sampling distribution); eval sessions allow it.
    training: bool = True
    metadata: dict[str, str] = Field(default_factory=dict, max_length=64)


class DialectBaseUrls(BaseModel):
    """What to put in each harness's base-URL setting (each SDK appends its own path to these)."""

    openai: str  # OPENAI_BASE_URL / codex provider base_url: .../v1
    anthropic: str  # ANTHROPIC_BASE_URL (the SDK appends /v1/messages)
    gemini: str  # GOOGLE_GEMINI_BASE_URL (the SDK appends /v1beta/models/...)


class CreateSessionResponse(BaseModel):
    session_id: str  # the harness's API key; >= 128 random bits
    base_url: str  # the owning replica's stable URL
    replica_id: str
    dialect_base_urls: DialectBaseUrls
    model: str  # the policy name the proxy serves now (harnesses may send any model name)
    policy_version: int
    call_budget: int


class SessionStatus(StrEnum):
    active = "active"
    budget_exhausted = "budget_exhausted"  # the call budget ran out; the harness got a final message
    context_exhausted = "context_exhausted"  # the engine's context length was reached; ended gracefully
    closed = "closed"  # DELETE /sessions/{id}
    expired = "expired"  # TTL


class SessionInfo(BaseModel):
    session_id: str
    rollout_id: str
    task_id: str
    harness: str
    group_id: str
    training: bool
    metadata: dict[str, str]
    status: SessionStatus
    call_budget: int
    calls: int  # model calls answered (including budget/context final messages)
    turns: int  # captured turns (valid + bad)
    bad_turns: int  # captured but invalid (kept as context only)
    tool_calls: int  # tool calls the model made in this session
    # Of those, calls the harness cannot run: to a tool the call did not offer, or arguments its schema refuses.
    unknown_tool_calls: int = 0
    invalid_tool_calls: int = 0
    # Calls that started one more training sequence, by cause (trajectory.models.BreakCause).
    prefix_breaks: dict[BreakCause, int] = {}
    errors: list[str]  # upstream/validation errors, newest last (bounded)
    # Calls that found no engine to serve them (all down or restarting) or whose engine stream broke: the
    # runner counts a harness failure after one as the infrastructure's, not the policy's. Not journaled.
    engine_failures: int = 0
    policy_versions: list[int]  # distinct policy versions seen, ascending
    created_at: float  # unix seconds
    last_activity_at: float


class SequencesResponse(BaseModel):
    session_id: str
    rollout_id: str
    status: SessionStatus
    tool_calls: int
    sequences: list[TrainingSequence]


class PolicyState(BaseModel):
    """The policy the proxy sends upstream: the base model name or a LoRA adapter `<name>-v<N>`."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=512)
    version: int = Field(ge=0)


class AdminError(BaseModel):
    detail: str


class ProxyClient:
    """The proxy's admin API over `http`, with one bearer credential: the run's runner token (the session routes a
    runner uses) or its admin token (all of them). Each call names the proxy: a run has replicas, and a session
    lives on one. A failed call raises httpx.HTTPError (httpx.HTTPStatusError for an answer outside 2xx: 401
    without a token, 403 with a wrong one, 404 for an unknown session); a reply that is not the contract's model
    raises ValueError."""

    def __init__(self, http: httpx.AsyncClient, token: str) -> None:
        self.http = http
        self.headers = bearer(token)

    async def create_session(self, proxy_url: str, request: CreateSessionRequest) -> CreateSessionResponse:
        response = await self.http.post(_url(proxy_url, SESSIONS_PATH), json=request.model_dump(mode="json"),
                                        headers=self.headers)
        return reply(response, CreateSessionResponse)

    async def session(self, proxy_url: str, session_id: str) -> SessionInfo:
        response = await self.http.get(_url(proxy_url, SESSION_PATH.format(session_id=session_id)), headers=self.headers)
        return reply(response, SessionInfo)

    async def close_session(self, proxy_url: str, session_id: str) -> SessionInfo:
        """End the session; its final state."""
        response = await self.http.delete(_url(proxy_url, SESSION_PATH.format(session_id=session_id)),
                                          headers=self.headers)
        return reply(response, SessionInfo)

    async def sequences(self, proxy_url: str, session_id: str) -> SequencesResponse:
        response = await self.http.get(_url(proxy_url, SEQUENCES_PATH.format(session_id=session_id)),
                                       headers=self.headers)
        return reply(response, SequencesResponse)

    async def put_policy(self, proxy_url: str, policy: PolicyState) -> PolicyState:
        """Have the proxy serve `policy` (admin); the policy it serves now."""
        response = await self.http.put(_url(proxy_url, POLICY_PATH), json=policy.model_dump(), headers=self.headers)
        return reply(response, PolicyState)


def _url(proxy_url: str, path: str) -> str:
    return proxy_url.rstrip("/") + path
