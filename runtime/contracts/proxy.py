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

from harnessrl.runtime.trajectory.models import BreakCause, TrainingSequence
from pydantic import BaseModel, ConfigDict, Field

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
