"""What the coordinator server serves: a `LeaseService` (the learner's Coordinator, the evaluation's
EvalCoordinator), and the replay of its journal after a restart."""

from __future__ import annotations

import logging
from typing import Protocol

from harnessrl.runtime.contracts.coordinator import AckStatus, Completion, CompletionAck, Lease, LeaseRequest
from harnessrl.runtime.coordinator.journal import Journal, JournalEntry
from harnessrl.runtime.trajectory.models import TrainingSequence
from pydantic import BaseModel

log = logging.getLogger(__name__)


class LeaseService(Protocol):
    """A coordinator's state machine: no I/O, time passed in. `CoordinatorError` (404 when `UnknownRollout`) for
    requests it refuses."""

    lease_ttl_s: float

    @property
    def done(self) -> bool:
        """Nothing more to lease, ever: runners are told to exit."""
        ...

    @property
    def journal_seq(self) -> int:
        """Completions applied so far: the seq of the last one journaled."""
        ...

    def lease(self, req: LeaseRequest, now: float) -> list[Lease]: ...
    def renew(self, lease_ids: list[str], now: float) -> list[str]: ...
    def release(self, runner_id: str, pool: str) -> int: ...

    def check(self, c: Completion) -> CompletionAck | None:
        """The ack of a completion that changes nothing (a duplicate), or None when it must be applied. Reads only."""
        ...

    def count_duplicate(self) -> None: ...

    def trains_on(self, rollout_id: str) -> bool:
        """Whether a scored completion of this rollout needs its session's sequences (a training rollout)."""
        ...

    def harness_of(self, rollout_id: str) -> str: ...
    def complete(self, c: Completion, sequences: list[TrainingSequence]) -> CompletionAck:
        """Apply a completion (a duplicate changes nothing but its count)."""
        ...

    def committed(self) -> None:
        """Called after each accepted completion is journaled."""
        ...

    def status(self) -> BaseModel: ...


def commit(service: LeaseService, journal: Journal, c: Completion, sequences: list[TrainingSequence]) -> CompletionAck:
    """Apply a completion and, when accepted, journal it (fsync'd) before anyone hears the ack. Synchronous: in the
    server nothing else can run between the two, so a checkpoint never falls between them."""
    harness = service.harness_of(c.rollout_id)
    ack = service.complete(c, sequences)
    if ack.status == AckStatus.accepted:
        journal.append(JournalEntry(seq=service.journal_seq, harness=harness, completion=c, sequences=sequences))
        service.committed()
    return ack


def replay(service: LeaseService, journal: Journal, after_seq: int = 0) -> int:
    """Apply the journal's completions past `after_seq` (the checkpoint's) again, in order; how many."""
    n = 0
    for entry in journal.entries_after(after_seq):
        service.complete(entry.completion, entry.sequences)
        n += 1
    if n:
        log.info("replayed %d completions from %s", n, journal.path)
    return n
