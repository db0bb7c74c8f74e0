"""Which HarnessPools a run uses (trained on, evaluated under) and its share of each pool's runners."""

from __future__ import annotations

from harnessrl.operator.api.harnesspool import HarnessPoolSpec
from harnessrl.operator.api.trainingrun import TrainingRunSpec


def pool_share(total: int, users: set[str], run: str) -> int:
    """The runner replicas `run` gets of a pool's `total`, split evenly among the runs using it (the first runs by
    name get one more where it does not divide), so that the pool's replicas, its scale subresource and an HPA on
    it count runners across all of them instead of multiplying by the number of runs. A pool with fewer replicas
    than runs still gives each run one (none starves); a pool scaled to zero gives none."""
    ordered = sorted(users | {run})
    share = total // len(ordered) + (1 if ordered.index(run) < total % len(ordered) else 0)
    return max(share, 1) if total > 0 else 0


def eval_pool_names(spec: TrainingRunSpec) -> list[str]:
    """The pools evaluated under: spec.eval.harnesses, else every trained pool; none without spec.eval."""
    if spec.eval is None:
        return []
    return list(spec.eval.harnesses) or [ref.pool for ref in spec.harnesses]


def pool_names(spec: TrainingRunSpec) -> list[str]:
    """Every pool the run needs runners of: the trained ones, then eval-only ones."""
    return list(dict.fromkeys([*(ref.pool for ref in spec.harnesses), *eval_pool_names(spec)]))


def harness_name(pool: HarnessPoolSpec) -> str:
    known, custom = pool.harness.known, pool.harness.custom
    return known.name if known is not None else custom.name  # type: ignore[union-attr]
