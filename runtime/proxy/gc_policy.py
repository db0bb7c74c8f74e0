"""The proxy process's garbage-collector policy: each collection walks only what is new.

A replica holds thousands of live sessions (history memos, canonical messages, call graphs): objects that live for
minutes. With the thresholds the proxy had (50,000 / 20 / 100), at 5,000 sessions on four workers a young
collection took up to 120 ms of CPU (340 ms of wall time on two shared cores), and every call on that worker
waited for it. So the survivors of every collection are frozen (`gc.freeze`): the next collection walks only the
objects created since (then: at most 33 ms of CPU, and p99 added 224 → 40 ms, CPU per call 1.96 → 1.55 ms;
benchmarks/proxy/README.md, History).

Frozen objects still die by reference counting, as a session's do when it ends. Only reference cycles among frozen
objects are left, and they wait for a full collection, which thaws everything, collects it once and freezes the
survivors again: the proxy's sweeper asks for one every `full_every_s` (one pause that long, not one every few
seconds). The workers of a replica take turns: worker K of W is due a `K / W` part of the interval earlier than
worker 0, since at 5,000 sessions a full collection held each worker for ~0.9 s of wall time when all four ran
one together (0.4 s of CPU each), and p99 added rose from 25 to 269 ms in that level.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("harnessrl.proxy")

# Objects allocated (net) between young collections. Frozen survivors are never walked again, so the threshold
# sets how long one collection takes (13 ms of CPU at the 90th percentile at 10,000, measured at 5,000 sessions),
# not the total.
YOUNG_THRESHOLD = 10_000


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop":
        gc.freeze()


@dataclass
class FreezingCollector:
    full_every_s: float = 600.0
    installed: bool = False
    last_full: float = 0.0  # set by install

    def install(self, phase: float = 0.0) -> None:
        """Make this process's collections freeze their survivors (once per process: the proxy's main); the first
        full collection is due after (1 - `phase`) of the interval."""
        self.last_full = time.monotonic() - phase * self.full_every_s
        gc.set_threshold(YOUNG_THRESHOLD)
        if _freeze_survivors not in gc.callbacks:
            gc.callbacks.append(_freeze_survivors)
        self.installed = True

    def uninstall(self) -> None:
        if _freeze_survivors in gc.callbacks:
            gc.callbacks.remove(_freeze_survivors)
        gc.unfreeze()
        self.installed = False

    def collect_if_due(self, now: float | None = None) -> bool:
        """Run a full collection if the last one is `full_every_s` old (only where installed)."""
        now = time.monotonic() if now is None else now
        if not self.installed or now - self.last_full < self.full_every_s:
            return False
        started = time.perf_counter()
        gc.unfreeze()
        unreachable = gc.collect()  # its survivors are frozen again by the callback
        self.last_full = now
        log.info("full garbage collection: %d unreachable objects, %.0f ms; %d objects frozen", unreachable,
                 (time.perf_counter() - started) * 1000, gc.get_freeze_count())
        return True


COLLECTOR = FreezingCollector()
