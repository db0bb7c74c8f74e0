"""The learner's progress, as the operator reads it: `GET <coordinator>/v1/status` (CoordinatorStatus, owned
by the learner in runtime/learner/protocol.py).

Why HTTP and not a ConfigMap the learner writes: the coordinator already serves this, so the learner needs no
API credentials at all; the operator polls it on each reconcile (a bounded, short request). The fields beyond
CoordinatorStatus's required ones are read when the learner reports them, and ignored otherwise.
"""

from __future__ import annotations

import logging

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger("harnessrl.operator.progress")
STATUS_PATH = "/v1/status"


class PoolRollouts(BaseModel):
    model_config = ConfigDict(extra="ignore")

    active: int = Field(0, ge=0)
    completed: int = Field(0, ge=0)
    failed: int = Field(0, ge=0)
    timed_out: int = Field(0, ge=0)


class EvalRound(BaseModel):
    """The evaluation round the learner is waiting for (training steps pause until it is done)."""

    model_config = ConfigDict(extra="ignore")

    step: int = Field(ge=0)
    rollouts: int = Field(0, ge=0)
    finished: int = Field(0, ge=0)


class LearnerProgress(BaseModel):
    """What the operator takes from the learner's status (a subset, tolerant of additions)."""

    model_config = ConfigDict(extra="ignore")

    step: int = Field(ge=0)
    policy_version: int = Field(ge=0)
    rollouts_scored: int = Field(0, ge=0)
    rollouts_unscored: int = Field(0, ge=0)
    rollouts_stale: int = Field(0, ge=0)
    done: bool = False
    mean_reward: float | None = None
    pass_at1: dict[str, float] = Field(default_factory=dict)  # of the latest evaluation round, by pool
    evaluating: EvalRound | None = None
    latest_checkpoint: str | None = None
    hub_revision: str | None = None
    # Set while the last Hub export failed (the learner keeps training and retries at the next checkpoint).
    export_error: str | None = None
    pools: dict[str, PoolRollouts] = Field(default_factory=dict)


def fetch(base_url: str, timeout: float = 2.0) -> LearnerProgress | None:
    """The learner's progress, or None when it cannot be reached or answers nonsense (logged, not raised:
    a learner that is starting or restarting is normal)."""
    try:
        response = httpx.get(base_url.rstrip("/") + STATUS_PATH, timeout=timeout)
        response.raise_for_status()
        return LearnerProgress.model_validate(response.json())
    except (httpx.HTTPError, ValueError, ValidationError) as exc:
        log.debug("learner status at %s unavailable: %s", base_url, exc)
        return None
