"""The proxy's garbage-collector policy (gc_policy.py), in this test process: collections freeze their
survivors, so later young and even full collections pass over them, until the periodic full collection thaws and
collects everything. The fixture puts the process's collector back as it was."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator

import pytest
from harnessrl.runtime.proxy.gc_policy import YOUNG_THRESHOLD, FreezingCollector


class Node:
    other: Node | None = None


def _cycle() -> weakref.ref[Node]:
    """Two objects that only reference each other, and a weak reference that shows when they are freed."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def collector() -> Iterator[FreezingCollector]:
    thresholds = gc.get_threshold()
    collector = FreezingCollector(full_every_s=600.0)
    collector.install()
    collector.last_full = 0.0  # as if the last full collection ran at monotonic time 0
    try:
        yield collector
    finally:
        collector.uninstall()
        gc.set_threshold(*thresholds)


def test_a_collection_freezes_its_survivors(collector: FreezingCollector) -> None:
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    kept = [Node() for _ in range(1000)]
    gc.collect(0)
    assert gc.get_freeze_count() >= len(kept)
    assert kept[0] not in gc.get_objects(0) + gc.get_objects(1) + gc.get_objects(2)


def test_a_young_cycle_is_still_collected(collector: FreezingCollector) -> None:
    freed = _cycle()
    gc.collect(0)
    assert freed() is None


def test_a_cycle_frozen_before_it_became_garbage_waits_for_the_full_collection(collector: FreezingCollector) -> None:
    a, b = Node(), Node()
    a.other, b.other = b, a
    probe = weakref.ref(a)
    gc.collect(0)  # a and b survive, and are frozen
    del a, b  # now unreachable, but only as a cycle
    gc.collect()
    assert probe() is not None  # frozen: not even a full collection of the generations looks at it
    assert not collector.collect_if_due(now=599.0)  # the last full collection is not old enough yet
    assert probe() is not None
    assert collector.collect_if_due(now=600.0)
    assert probe() is None
    assert collector.last_full == 600.0 and gc.get_freeze_count() > 0  # the survivors are frozen again


def test_worker_k_of_w_is_due_k_w_of_the_interval_earlier(collector: FreezingCollector) -> None:
    before = time.monotonic()
    collector.install(phase=0.25)  # worker 1 of 4: due after 450 s, not 600
    after = time.monotonic()
    assert not collector.collect_if_due(now=before + 449.0)
    assert collector.collect_if_due(now=after + 450.0)


def test_without_install_nothing_is_collected_on_schedule() -> None:
    assert not FreezingCollector(full_every_s=0.0).collect_if_due()
