"""The coordinator's HTTP surface (FastAPI), one for training and evaluation: leases, renewals, releases,
completions, status, health, Prometheus metrics (the protocol of runtime/contracts/coordinator.py).

It serves a `LeaseService` (service.py): the learner's Coordinator (training groups and evaluation rounds) or the
evaluation's EvalCoordinator. Every mutation runs on the event loop, so a checkpoint's snapshot of the state is
always consistent. A completion is applied and journaled with no await between the two, before it is acked.
Leases, renewals, releases and completions need the run's runner token (401 otherwise), checked with the body's
declared size (at most MAX_BODY_BYTES) before a byte of the body is read (runtime/serving.py BearerBeforeBody):
an unauthenticated 200 MB POST took the learner from 63 to 644 MB (issue #47) when FastAPI parsed bodies first.
Status, health and metrics are open and read-only (no secret in them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse
from harnessrl.runtime.contracts.coordinator import (
    SCORED_OUTCOMES,
    Completion,
    CompletionAck,
    LeaseRelease,
    LeaseReleaseResponse,
    LeaseRenewal,
    LeaseRenewalResponse,
    LeaseRequest,
    LeaseResponse,
    OutcomeKind,
    renew_every,
)
from harnessrl.runtime.coordinator.journal import Journal
from harnessrl.runtime.coordinator.leases import CoordinatorError, UnknownRollout
from harnessrl.runtime.coordinator.service import LeaseService, commit
from harnessrl.runtime.serving import BearerBeforeBody
from harnessrl.runtime.trajectory.models import TrainingSequence
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel

log = logging.getLogger(__name__)

# A completion is the largest write: grader output (64 KiB of text, JSON-escaped) and an error (8 KiB).
MAX_BODY_BYTES = 2 * 1024 * 1024
# Fetches a completed session's sequences: (session id, owning replica URL or None) -> sequences.
SequenceFetcher = Callable[[str, str | None], Awaitable[list[TrainingSequence]]]


async def _no_sequences(session_id: str, base_url: str | None) -> list[TrainingSequence]:
    raise RuntimeError("this coordinator fetches no sequences")


def create_app(
    service: LeaseService,
    journal: Journal,
    runner_token: str,
    fetch: SequenceFetcher = _no_sequences,
    registry: CollectorRegistry | None = None,
    retry_after_s: float = 1.0,
    clock: Callable[[], float] = time.time,
    title: str = "harnessrl coordinator",
) -> FastAPI:
    app = FastAPI(title=title)
    # Every write (POST) needs the runner token, checked before its body is read.
    app.add_middleware(BearerBeforeBody, token=runner_token, max_body_bytes=MAX_BODY_BYTES, what="runner")
    metrics_registry = registry if registry is not None else CollectorRegistry()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(metrics_registry).decode(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/status", response_model=None)  # the service's own status model
    async def status() -> BaseModel:
        return service.status()

    @app.post("/v1/leases", response_model=LeaseResponse)
    async def lease(req: LeaseRequest) -> LeaseResponse:
        if service.done:
            return LeaseResponse(done=True, retry_after_s=0)
        try:
            leases = service.lease(req, clock())
        except CoordinatorError as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from None
        return LeaseResponse(
            leases=leases, retry_after_s=0 if leases else retry_after_s, renew_every_s=renew_every(service.lease_ttl_s)
        )

    @app.post("/v1/leases/renew", response_model=LeaseRenewalResponse)
    async def renew(req: LeaseRenewal) -> LeaseRenewalResponse:
        return LeaseRenewalResponse(renewed=service.renew(req.lease_ids, clock()))

    @app.post("/v1/leases/release", response_model=LeaseReleaseResponse)
    async def release(req: LeaseRelease) -> LeaseReleaseResponse:
        return LeaseReleaseResponse(released=service.release(req.runner_id, req.pool))

    @app.post("/v1/completions", response_model=CompletionAck)
    async def complete(c: Completion) -> CompletionAck:
        try:
            dup = service.check(c)
        except UnknownRollout as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from None
        except CoordinatorError as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from None
        if dup is not None:
            service.count_duplicate()
            return dup
        sequences: list[TrainingSequence] = []
        # An eval rollout is scored by its outcome alone: its tokens are never trained on.
        if c.outcome in SCORED_OUTCOMES and service.trains_on(c.rollout_id):
            if c.session_id is None:
                raise HTTPException(status_code=422, detail="a scored completion needs its session_id")
            try:
                sequences = await fetch(c.session_id, c.session_base_url)
            except Exception as exc:
                # The rollout happened but its tokens are out of reach: an infrastructure failure, unscored.
                log.warning("sequences of session for %s unavailable: %s", c.rollout_id, exc)
                c = c.model_copy(update={"outcome": OutcomeKind.infra_error, "error": f"sequences fetch: {exc}"[:8192]})
        return commit(service, journal, c, sequences)

    return app
