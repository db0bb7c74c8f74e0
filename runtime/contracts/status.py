"""The coordinator's status as its readers fetch it: `GET <coordinator>/v1/status` -> CoordinatorStatus
(contracts/coordinator.py). The operator polls it on each reconcile, the live view on each refresh.

Why HTTP and not a ConfigMap the learner writes: the coordinator already serves this, so the learner needs no
API credentials at all; a poll is a bounded, short request.
"""

from __future__ import annotations

import logging

import httpx
from harnessrl.runtime.contracts.client import reply
from harnessrl.runtime.contracts.coordinator import STATUS_PATH, CoordinatorStatus
from pydantic import ValidationError

log = logging.getLogger("harnessrl.contracts.status")


def fetch(base_url: str, timeout: float = 2.0) -> CoordinatorStatus | None:
    """The coordinator's status, or None when it cannot be reached or answers nonsense (logged, not raised:
    a learner that is starting or restarting is normal)."""
    try:
        return reply(httpx.get(base_url.rstrip("/") + STATUS_PATH, timeout=timeout), CoordinatorStatus)
    except (httpx.HTTPError, ValueError, ValidationError) as exc:
        log.debug("coordinator status at %s unavailable: %s", base_url, exc)
        return None
