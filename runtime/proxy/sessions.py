"""Sessions of one replica: their state, how a call changes it, and the journal records that replay it.

Every change to a session is one journal record applied by the same function live and on replay, so a
restarted replica rebuilds exactly the state its clients saw (`GET /sessions/{id}` byte for byte).
Record kinds:
  {"k": "session", "sid", "req", "budget", "at"}                  created
  {"k": "call", "sid", "at", "status", "answered", "error", "turn"}  one dialect call (turn: a TurnDelta or null)
  {"k": "end", "sid", "reason"}                                   deleted or expired
  {"k": "policy", "model", "version"}                             the served policy changed
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from harnessrl.runtime.contracts.proxy import CreateSessionRequest, PolicyState, SessionInfo, SessionStatus
from harnessrl.runtime.proxy.dialects.base import EncodedMessages, HistoryMemo
from harnessrl.runtime.proxy.dialects.prompt_prefix import KnownPrefix
from harnessrl.runtime.proxy.splicing import HistoryKeys
from harnessrl.runtime.proxy.tool_check import ToolMismatch, ToolValidators
from harnessrl.runtime.trajectory.graph import SessionGraph
from harnessrl.runtime.trajectory.models import Node, SessionSequences, Turn, TurnDelta, capture_problems

MAX_ERRORS = 20


def new_session_id(owner: str = "") -> str:
    """192 random bits, then the creating worker's address (relay.py): any worker of the proxy can tell the owner."""
    token = secrets.token_urlsafe(24)
    return f"{token}.{owner}" if owner else token


@dataclass
class Session:
    id: str
    request: CreateSessionRequest
    call_budget: int
    created_at: float
    last_activity_at: float
    status: SessionStatus = SessionStatus.active
    calls: int = 0
    bad_turns: int = 0
    tool_calls: int = 0
    # Tool calls the harness cannot run (tool_check.py): to tools the call did not offer, or against their schema.
    unknown_tool_calls: int = 0
    invalid_tool_calls: int = 0
    errors: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_ERRORS))
    engine_failures: int = 0
    policy_versions: set[int] = field(default_factory=set)
    # The last request's history as parsed, so the next call parses only what it appends. Not journaled.
    history: HistoryMemo = field(default_factory=HistoryMemo)
    # The last upstream body's messages, encoded, so the next call encodes only the new ones. Not journaled.
    upstream_messages: EncodedMessages = field(default_factory=EncodedMessages)
    # The chain keys of the last request's replies, so the next call keys only new ones (splicing). Not journaled.
    reply_keys: HistoryKeys = field(default_factory=HistoryKeys)
    # The argument schemas of the session's tools, compiled once (tool_check.py). Not journaled.
    tool_validators: ToolValidators = field(default_factory=ToolValidators)
    # The latest turn's prompt + completion as JSON text, so the next answer parses only its new prompt ids. Not
    # journaled; one per session, not per turn.
    prompt_prefix: KnownPrefix | None = None
    graph: SessionGraph = field(init=False)

    def __post_init__(self) -> None:
        self.graph = SessionGraph(self.id)

    @property
    def ended(self) -> bool:
        return self.status is not SessionStatus.active

    @property
    def budget_left(self) -> int:
        return self.call_budget - self.calls

    def info(self) -> SessionInfo:
        req = self.request
        return SessionInfo(
            session_id=self.id,
            rollout_id=req.rollout_id,
            task_id=req.task_id,
            harness=req.harness,
            group_id=req.group_id,
            training=req.training,
            metadata=req.metadata,
            status=self.status,
            call_budget=self.call_budget,
            calls=self.calls,
            turns=len(self.graph),
            bad_turns=self.bad_turns,
            tool_calls=self.tool_calls,
            unknown_tool_calls=self.unknown_tool_calls,
            invalid_tool_calls=self.invalid_tool_calls,
            prefix_breaks=dict(self.graph.breaks),
            errors=list(self.errors),
            engine_failures=self.engine_failures,
            policy_versions=sorted(self.policy_versions),
            created_at=self.created_at,
            last_activity_at=self.last_activity_at,
        )

    def sequences(self) -> SessionSequences:
        return self.graph.sequences()

    def nodes(self) -> list[Node]:
        return [self.graph.node(i) for i in range(len(self.graph))]

    def _apply(self, at: float, status: SessionStatus, answered: bool, error: str | None,
               turn: Mapping[str, Any] | None, mismatch: Sequence[int] | None) -> None:
        """`turn` holds the call's `TurnDelta` fields (at least tool_calls, policy_version and trainable);
        `mismatch` its unknown and invalid tool calls."""
        self.last_activity_at = at
        if mismatch:
            self.unknown_tool_calls += mismatch[0]
            self.invalid_tool_calls += mismatch[1]
        self.status = status
        if answered:
            self.calls += 1
        if error:
            self.errors.append(error)
        if turn is not None:
            self.tool_calls += turn["tool_calls"]
            self.policy_versions.add(turn["policy_version"])
            if not turn["trainable"]:
                self.bad_turns += 1

    def record_call(
        self,
        *,
        status: SessionStatus | None = None,
        answered: bool,
        error: str | None = None,
        turn: Turn | None = None,
        prompt_text: bytes | None = None,
        after: int | None = None,
        at: float | None = None,
        mismatch: ToolMismatch = ToolMismatch(),
    ) -> dict[str, Any]:
        """Apply one call to the live session and return the journal record that replays it.

        Linking happens here (O(prompt length)); the record stores only the prompt tokens beyond the parent.
        A turn the call graph refuses to train on (see `capture_problems`) is kept as context, and why is
        recorded as the call's error. `prompt_text` is the turn's prompt ids as the engine wrote them (see
        `CallCapture.prompt_text`); `after`: a turn whose prompt + completion the turn's prompt starts with
        (`CallCapture.after`), where linking starts. `mismatch`: the turn's tool calls the harness cannot run."""
        at = time.time() if at is None else at
        new_status = self.status if status is None else status
        delta: dict[str, Any] | None = None
        if turn is not None:
            turn_id = self.graph.add(turn, after).id
            delta = self.graph.delta(turn_id)
            if prompt_text is not None:
                tokens = partial(self.graph.sequence_tokens, turn_id)
                self.prompt_prefix = KnownPrefix.of(prompt_text, turn.completion_ids, tokens, turn_id)
            if not delta["trainable"]:
                problems = "; ".join(capture_problems(turn)) or "marked untrainable"
                error = f"turn {turn_id} kept as context only: {problems}"
        tools = [mismatch.unknown, mismatch.invalid] if mismatch else None
        self._apply(at, new_status, answered, error, delta, tools)
        record = {
            "k": "call",
            "sid": self.id,
            "at": at,
            "status": new_status.value,
            "answered": answered,
            "error": error,
            "turn": delta,
        }
        if tools:
            record["tools"] = tools
        return record

    def replay_call(self, record: dict[str, Any]) -> None:
        applied: dict[str, Any] | None = None
        if record.get("turn") is not None:
            delta = TurnDelta.model_validate(record["turn"])
            self.graph.add_delta(delta)
            applied = delta.model_dump(include={"tool_calls", "policy_version", "trainable"})
        self._apply(float(record["at"]), SessionStatus(record["status"]), bool(record["answered"]),
                    record.get("error"), applied, record.get("tools"))


@dataclass
class SessionStore:
    """This replica's sessions, keyed by id (the harness's API key)."""

    default_budget: int
    ttl_s: float
    owner: str = ""  # this worker's address, at the end of the ids it creates (relay.py)
    sessions: dict[str, Session] = field(default_factory=dict)
    policy: PolicyState | None = None

    def __len__(self) -> int:
        return len(self.sessions)

    def get(self, session_id: str) -> Session | None:
        return self.sessions.get(session_id)

    def create(self, request: CreateSessionRequest, at: float | None = None) -> tuple[Session, dict[str, Any]]:
        at = time.time() if at is None else at
        record = {
            "k": "session",
            "sid": new_session_id(self.owner),
            "req": request.model_dump(mode="json"),
            "budget": request.call_budget or self.default_budget,
            "at": at,
        }
        return self._open(record), record

    def _open(self, record: dict[str, Any]) -> Session:
        session = Session(
            id=record["sid"],
            request=CreateSessionRequest.model_validate(record["req"]),
            call_budget=int(record["budget"]),
            created_at=float(record["at"]),
            last_activity_at=float(record["at"]),
        )
        self.sessions[session.id] = session
        return session

    def end(self, session_id: str, reason: str) -> tuple[Session | None, dict[str, Any]]:
        return self.sessions.pop(session_id, None), {"k": "end", "sid": session_id, "reason": reason}

    def expired(self, now: float) -> list[str]:
        return [sid for sid, s in self.sessions.items() if now - s.last_activity_at > self.ttl_s]

    def set_policy(self, policy: PolicyState) -> dict[str, Any]:
        self.policy = policy
        return {"k": "policy", **policy.model_dump(mode="json")}

    def replay(self, record: dict[str, Any]) -> None:
        """Apply one journal record (rebuilding after a restart)."""
        kind = record.get("k")
        if kind == "session":
            self._open(record)
        elif kind == "call":
            session = self.sessions.get(record["sid"])
            if session is not None:
                session.replay_call(record)
        elif kind == "end":
            self.sessions.pop(record["sid"], None)
        elif kind == "policy":
            self.policy = PolicyState(model=record["model"], version=record["version"])

    def keeps(self, record: dict[str, Any]) -> bool:
        """Whether compaction keeps a record: everything of live sessions, and the latest policy."""
        if record.get("k") == "policy":
            return self.policy is not None and record.get("version") == self.policy.version
        return record.get("sid") in self.sessions
