"""The lease machine (runtime/coordinator/leases.py) every rollout slot follows, training's and evaluation's:
grant, renew, release, expiry back to pending under a new lease id, and completions of stale leases."""

from __future__ import annotations

from enum import StrEnum

import pytest
from harnessrl.runtime.coordinator import leases
from hypothesis import given, settings
from hypothesis import strategies as st


class Status(StrEnum):
    pending = "pending"
    leased = "leased"
    final = "final"


class Slot(leases.LeasedSlot):
    status: Status = Status.pending


def test_grant_leases_a_pending_slot_under_a_fresh_id() -> None:
    s = Slot(rollout_id="g0000001-r000")
    first = leases.grant(s, "runner-a", now=10.0, ttl_s=30.0)
    assert s.status is Status.leased and (s.lease_id, s.lease_deadline, s.runner_id) == (first, 40.0, "runner-a")
    assert first.startswith("g0000001-r000.a1-") and leases.is_lease_of(s.rollout_id, first)
    assert not leases.is_lease_of(s.rollout_id, "g0000001-r001.a1-0")
    with pytest.raises(AssertionError):
        leases.grant(s, "runner-b", now=11.0, ttl_s=30.0)  # a leased slot is not granted twice
    # A restarted process counts leases from 0 again: the random part keeps the id new.
    again = Slot(rollout_id="g0000001-r000")
    assert leases.grant(again, "runner-a", 10.0, 30.0) != first


def test_renew_moves_only_live_leases_and_release_expires_a_runners_leases() -> None:
    a, b, c = (Slot(rollout_id=f"r{i}") for i in range(3))
    ia, ib = leases.grant(a, "x", 0.0, 10.0), leases.grant(b, "x", 0.0, 10.0)
    leases.grant(c, "y", 0.0, 10.0)
    assert leases.renew([a, b, c], {ia, "r1.a9-dead", "r9.a1-0"}, deadline=25.0) == [ia]
    assert (a.lease_deadline, b.lease_deadline) == (25.0, 10.0)
    assert leases.expire([a, b, c], now=12.0) == [b, c]
    assert b.status is Status.pending and (b.lease_id, b.lease_deadline, b.runner_id) == (None, None, None)
    assert leases.renew([b], {ib}, 99.0) == []  # an expired lease is not brought back
    assert leases.release([a, b, c], "x") == 1 and a.status is Status.leased  # freed at the next expiry sweep
    assert leases.expire([a, b, c], now=12.0) == [a]
    assert leases.grant(a, "z", 12.0, 10.0).startswith("r0.a2-")


def test_a_stale_lease_does_not_take_the_slot_from_its_live_holder() -> None:
    s = Slot(rollout_id="r0")
    old = leases.grant(s, "dead", 0.0, 5.0)
    leases.expire([s], now=6.0)
    live = leases.grant(s, "alive", 6.0, 5.0)
    assert leases.finish(s, old) is False  # the caller counts it but leaves the slot leased to "alive"
    assert (s.status, s.lease_id, s.runner_id) == (Status.leased, live, "alive") and leases.repeated(s, old)
    assert leases.finish(s, live) is True and s.lease_id is None
    leases.settle(s, Status.final)
    assert s.status is Status.final and s.finished_leases == [old, live]


def test_a_completion_after_expiry_frees_the_slot() -> None:
    s = Slot(rollout_id="r0")
    lease = leases.grant(s, "slow", 0.0, 5.0)
    leases.expire([s], now=6.0)
    assert leases.finish(s, lease) is True and not leases.repeated(s, "r0.a2-0")


ops = st.lists(st.tuples(st.sampled_from(["grant", "renew", "release", "expire", "finish", "tick"]),
                         st.integers(0, 3)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_lease_fields_stay_consistent_under_any_interleaving(script: list[tuple[str, int]]) -> None:
    """A slot is leased exactly when it holds a lease id, deadline and runner; lease ids are never reused; a
    finished lease never becomes live again."""
    slots = [Slot(rollout_id=f"r{i}") for i in range(3)]
    now, issued = 0.0, []
    for op, k in script:
        s = slots[k % 3]
        if op == "grant" and s.status == Status.pending:
            issued.append(leases.grant(s, f"runner-{k}", now, 5.0))
        elif op == "renew":
            leases.renew(slots, set(issued[-2:]), now + 5.0)
        elif op == "release":
            leases.release(slots, f"runner-{k}")
        elif op == "expire":
            leases.expire(slots, now)
        elif op == "finish" and issued:
            lease = issued[k % len(issued)]
            owner = next(x for x in slots if leases.is_lease_of(x.rollout_id, lease))
            if owner.status != Status.final and not leases.repeated(owner, lease) and leases.finish(owner, lease):
                leases.settle(owner, Status.final if k % 2 else Status.pending)
        else:
            now += 1.0 + k
        for x in slots:
            holds = (x.lease_id, x.lease_deadline, x.runner_id)
            assert (x.status == Status.leased) == all(v is not None for v in holds) and (
                x.status == Status.leased or holds == (None, None, None))
            assert x.lease_id not in x.finished_leases
    assert len(issued) == len(set(issued))
