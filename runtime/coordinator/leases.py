"""The lease machine of every rollout slot, training's and evaluation's: pending → leased → (final | pending).

A runner leases a pending slot for `ttl` seconds and renews the lease while it works; a lease not renewed by its
deadline (its runner died) or released (its runner restarted) expires, and the slot is pending again under a new
lease id. Completions name their lease: a repeat of a finished lease, or any completion of a final slot, changes
nothing (the caller acks it as a duplicate), so a rollout is never counted twice. What a slot's final states are,
and what an expiry costs, belong to the ledger that holds the slot (learner/coordinator.py, ledger.py).

Pure: time is passed in. Lease ids carry a random suffix, so an id handed out before a restart (lease counts are
not journaled) is never handed out again after it.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Iterable
from enum import StrEnum
from typing import TypeVar

from pydantic import BaseModel, Field

PENDING, LEASED = "pending", "leased"


class CoordinatorError(ValueError):
    """A request a coordinator refuses (a pool it does not serve, the wrong harness for a pool, a foreign lease)."""


class UnknownRollout(CoordinatorError):
    """A rollout id the coordinator never planned."""  # the values every slot status enum has; the final ones are its own


class LeasedSlot(BaseModel):
    """The lease fields of a slot; a ledger's slot model subclasses it with its own `status` enum."""

    rollout_id: str
    status: StrEnum
    leases: int = 0  # leases handed out (this process's count: it restarts with the process)
    lease_id: str | None = None
    lease_deadline: float | None = None
    runner_id: str | None = None
    finished_leases: list[str] = Field(default_factory=list)  # leases whose completion arrived


S = TypeVar("S", bound=LeasedSlot)


def _set(slot: LeasedSlot, status: str) -> None:
    slot.status = type(slot.status)(status)


def is_lease_of(rollout_id: str, lease_id: str) -> bool:
    """Whether `lease_id` has the form of a lease of `rollout_id` (a completion naming another's is refused)."""
    return lease_id.startswith(f"{rollout_id}.a")


def grant(slot: LeasedSlot, runner_id: str, now: float, ttl_s: float) -> str:
    """Lease a pending slot to `runner_id` until now + ttl; the new lease id."""
    assert slot.status == PENDING, slot
    slot.leases += 1
    _set(slot, LEASED)
    slot.lease_id = f"{slot.rollout_id}.a{slot.leases}-{secrets.token_hex(4)}"
    slot.lease_deadline, slot.runner_id = now + ttl_s, runner_id
    return slot.lease_id


def renew(slots: Iterable[LeasedSlot], lease_ids: Collection[str], deadline: float) -> list[str]:
    """Move the deadline of each slot still leased under one of `lease_ids`; the ids renewed."""
    renewed = []
    for s in slots:
        if s.status == LEASED and s.lease_id is not None and s.lease_id in lease_ids:
            s.lease_deadline = deadline
            renewed.append(s.lease_id)
    return renewed


def release(slots: Iterable[LeasedSlot], runner_id: str) -> int:
    """Expire at once the leases `runner_id` holds among `slots` (the next expiry sweep frees them, counted as any
    expiry); how many."""
    n = 0
    for s in slots:
        if s.status == LEASED and s.runner_id == runner_id:
            s.lease_deadline = float("-inf")
            n += 1
    return n


def expire(slots: Iterable[S], now: float) -> list[S]:
    """Slots whose lease ran out before `now`: pending again, lease cleared. The caller counts them."""
    out = []
    for s in slots:
        if s.status == LEASED and s.lease_deadline is not None and s.lease_deadline < now:
            _set(s, PENDING)
            s.lease_id, s.lease_deadline, s.runner_id = None, None, None
            out.append(s)
    return out


def repeated(slot: LeasedSlot, lease_id: str) -> bool:
    """A completion of this lease was already applied."""
    return lease_id in slot.finished_leases


def finish(slot: LeasedSlot, lease_id: str) -> bool:
    """Record the completion of `lease_id`. True when no other runner holds the slot now (this lease is the live one,
    or none is): then the caller decides its next status. False while another lease is live: an unscored
    completion of an expired lease must not take the slot from the runner that holds it now."""
    slot.finished_leases.append(lease_id)
    if slot.status == LEASED and slot.lease_id != lease_id:
        return False
    slot.lease_id, slot.lease_deadline, slot.runner_id = None, None, None
    return True


def settle(slot: LeasedSlot, status: str) -> None:
    """Set a slot's status after `finish` (a final one, or pending for another attempt); any live lease ends."""
    _set(slot, status)
    slot.lease_id, slot.lease_deadline, slot.runner_id = None, None, None
