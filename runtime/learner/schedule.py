"""Which task and which harness group k gets. Pure functions of k, so a restarted learner plans the same groups.

Harnesses rotate by smooth weighted round robin (nginx's SWRR: spreads a pool of weight 3 as A A B A, not
A A A B); tasks are drawn without replacement, reshuffled each epoch with a seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from harnessrl.runtime.contracts.learner_config import HarnessWeight


def swrr_cycle(harnesses: Sequence[HarnessWeight]) -> list[int]:
    """One full period (sum of weights long) of the smooth weighted round robin, as indices into `harnesses`."""
    total = sum(h.weight for h in harnesses)
    current = [0] * len(harnesses)
    order: list[int] = []
    for _ in range(total):
        for i, h in enumerate(harnesses):
            current[i] += h.weight
        # max() keeps the first of equal weights, so ties break by configuration order.
        best = max(range(len(harnesses)), key=lambda i: current[i])
        current[best] -= total
        order.append(best)
    return order


def task_for_group(task_ids: Sequence[str], k: int, seed: int, shuffle: bool) -> str:
    """Task of the k-th group: epoch k // n uses a permutation seeded by (seed, epoch)."""
    n = len(task_ids)
    epoch, index = divmod(k, n)
    order = list(task_ids)
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    return order[index]


class GroupPlanner:
    """Maps a group index to (task, pool, harness). Holds only derived, immutable data."""

    def __init__(self, task_ids: Sequence[str], harnesses: Sequence[HarnessWeight], seed: int, shuffle: bool):
        if not task_ids:
            raise ValueError("no tasks to plan groups from")
        if not harnesses:
            raise ValueError("no harnesses to plan groups for")
        self._tasks = list(task_ids)
        self._harnesses = list(harnesses)
        self._cycle = swrr_cycle(harnesses)
        self._seed = seed
        self._shuffle = shuffle

    def plan(self, k: int) -> tuple[str, HarnessWeight]:
        harness = self._harnesses[self._cycle[k % len(self._cycle)]]
        return task_for_group(self._tasks, k, self._seed, self._shuffle), harness
