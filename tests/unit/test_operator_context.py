"""The reconcile queue: triggers for one object coalesce, passes of one object never overlap, a failing pass
does not stop the others, and the resync re-triggers every known object."""

from __future__ import annotations

import threading
import time

import kubernetes.client
from harnessrl.operator.api.enginepool import PoolUsage
from harnessrl.operator.api.trainingrun import RunUsage
from harnessrl.operator.handlers.context import Context, OperatorOptions


def make_context(resync: float = 3600) -> Context:
    # The API client is never used here: the reconcilers are test functions.
    return Context(OperatorOptions(resync_seconds=resync), kubernetes.client.ApiClient(kubernetes.client.Configuration()))


def test_triggers_during_a_pass_coalesce_into_one_more_pass() -> None:
    ctx = make_context()
    started, release = threading.Event(), threading.Event()
    passes: list[str] = []
    overlap = threading.Lock()

    def reconcile(_: Context, namespace: str, name: str) -> None:
        assert overlap.acquire(blocking=False), "two passes of one object overlapped"
        try:
            passes.append(name)
            started.set()
            release.wait(5)
        finally:
            overlap.release()

    ctx.register("Run", reconcile)
    ctx.start()
    try:
        ctx.seen("Run", "ns", "a")
        assert started.wait(5)
        for _ in range(10):
            ctx.trigger(("Run", "ns", "a"))
        release.set()
        deadline = time.monotonic() + 5
        while ctx.busy() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        ctx.stop()
    assert passes == ["a", "a"]


def test_failures_are_contained_and_resync_retries() -> None:
    ctx = make_context(resync=0.05)
    calls: dict[str, int] = {"bad": 0, "good": 0}

    def reconcile(_: Context, namespace: str, name: str) -> None:
        calls[name] += 1
        if name == "bad":
            raise RuntimeError("API server unavailable")

    ctx.register("Run", reconcile)
    ctx.start()
    try:
        ctx.seen("Run", "ns", "bad")
        ctx.seen("Run", "ns", "good")
        deadline = time.monotonic() + 5
        while min(calls.values()) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        ctx.seen("Run", "ns", "bad", deleted=True)
    finally:
        ctx.stop()
    assert calls["bad"] >= 3 and calls["good"] >= 3
    assert ("Run", "ns", "bad") not in ctx.known and ("Run", "ns", "good") in ctx.known


def test_a_key_its_own_passes_keep_dirty_does_not_starve_the_others() -> None:
    """One worker; `busy` re-triggers itself during each of its passes (its own writes' events did so). Its extra
    passes queue behind `quiet` instead of holding the worker: `quiet` runs second, not after every `busy` pass."""
    ctx = Context(OperatorOptions(resync_seconds=3600, workers=1),
                  kubernetes.client.ApiClient(kubernetes.client.Configuration()))
    order: list[str] = []
    first = threading.Event()

    def reconcile(_: Context, namespace: str, name: str) -> None:
        order.append(name)
        if name == "busy" and order.count("busy") <= 5:
            ctx.trigger(("Run", "ns", "busy"))
        if len(order) == 1:
            ctx.trigger(("Run", "ns", "quiet"))  # queued while `busy` holds the only worker
            first.set()

    ctx.register("Run", reconcile)
    ctx.start()
    try:
        ctx.trigger(("Run", "ns", "busy"))
        assert first.wait(5)
        deadline = time.monotonic() + 5
        while ctx.busy() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        ctx.stop()
    assert order[:2] == ["busy", "quiet"] and order.count("busy") == 6


def test_what_the_context_keeps_of_an_object_goes_with_it() -> None:
    """The records kept per object (its last status write, its usage, the pools it runs on) are dropped when it is
    deleted: they do not grow with every run the operator ever saw."""
    ctx = make_context()
    ctx.kube._own_status[("TrainingRun", "ns", "a")] = "41"
    ctx.usage[("ns", "a")] = RunUsage(rollouts=3)
    ctx.pool_usage[("ns", "a")] = PoolUsage(gpu_seconds=60)
    assert ctx.use_pools("ns", "a", {"p"}) == set() and ctx.use_pools("ns", "b", {"p"}) == {"a"}
    ctx.seen("EnginePool", "ns", "a", deleted=True)  # a pool named as a run: the run's records stay
    assert ("ns", "a") not in ctx.pool_usage and ("ns", "a") in ctx.usage
    ctx.seen("TrainingRun", "ns", "a", deleted=True)
    assert ctx.use_pools("ns", "a", set()) == {"b"}  # b's share of p grows
    assert ("TrainingRun", "ns", "a") not in ctx.kube._own_status and ("ns", "a") not in ctx.usage
    assert ctx.pool_users("ns", "p") == {"b"}
