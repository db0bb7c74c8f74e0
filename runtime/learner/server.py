"""The coordinator's HTTP surface (FastAPI): leases, completions, status, health, Prometheus metrics.

Every coordinator mutation runs on the event loop (never in the training thread), so a checkpoint's
snapshot of the state is always consistent. A completion is journaled before it is acked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import httpx
from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse
from harnessrl.runtime.contracts.coordinator import (
    SCORED_OUTCOMES,
    Completion,
    CompletionAck,
    CoordinatorStatus,
    LeaseRelease,
    LeaseReleaseResponse,
    LeaseRenewal,
    LeaseRenewalResponse,
    LeaseRequest,
    LeaseResponse,
    OutcomeKind,
    renew_every,
)
from harnessrl.runtime.learner.coordinator import Coordinator, CoordinatorError, UnknownRollout
from harnessrl.runtime.learner.evaluation import is_eval_rollout
from harnessrl.runtime.learner.journal import Journal, JournalEntry
from harnessrl.runtime.trajectory.models import TrainingSequence
from prometheus_client import CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

# Fetches a completed session's sequences: (session id, owning replica URL or None) -> sequences.
SequenceFetcher = Callable[[str, str | None], Awaitable[list[TrainingSequence]]]


def proxy_fetcher(control: object, client: httpx.AsyncClient) -> SequenceFetcher:
    from harnessrl.runtime.learner.sync import ProxyControl

    assert isinstance(control, ProxyControl)

    async def fetch(session_id: str, base_url: str | None) -> list[TrainingSequence]:
        return list((await control.sequences(session_id, base_url, client)).sequences)

    return fetch


def create_app(
    coordinator: Coordinator,
    journal: Journal,
    fetch: SequenceFetcher,
    registry: CollectorRegistry,
    retry_after_s: float = 1.0,
    clock: Callable[[], float] = time.time,
) -> FastAPI:
    app = FastAPI(title="harnessrl coordinator")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/status", response_model=CoordinatorStatus)
    async def status() -> CoordinatorStatus:
        return coordinator.status()

    @app.post("/v1/leases", response_model=LeaseResponse)
    async def lease(req: LeaseRequest) -> LeaseResponse:
        if coordinator.state.done:
            return LeaseResponse(done=True, retry_after_s=0)
        try:
            leases = coordinator.lease(req, clock())
        except CoordinatorError as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from None
        return LeaseResponse(
            leases=leases, retry_after_s=0 if leases else retry_after_s, renew_every_s=renew_every(coordinator.lease_ttl_s)
        )

    @app.post("/v1/leases/renew", response_model=LeaseRenewalResponse)
    async def renew(req: LeaseRenewal) -> LeaseRenewalResponse:
        return LeaseRenewalResponse(renewed=coordinator.renew(req.lease_ids, clock()))

    @app.post("/v1/leases/release", response_model=LeaseReleaseResponse)
    async def release(req: LeaseRelease) -> LeaseReleaseResponse:
        return LeaseReleaseResponse(released=coordinator.release(req.runner_id, req.pool))

    @app.post("/v1/completions", response_model=CompletionAck)
    async def complete(c: Completion) -> CompletionAck:
        try:
            dup = coordinator.check(c)
        except UnknownRollout as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from None
        except CoordinatorError as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from None
        if dup is not None:
            coordinator.state.counters.duplicates += 1
            return dup
        sequences: list[TrainingSequence] = []
        # An eval rollout is scored by its outcome alone: its tokens are never trained on.
        if c.outcome in SCORED_OUTCOMES and not is_eval_rollout(c.rollout_id):
            if c.session_id is None:
                raise HTTPException(status_code=422, detail="a scored completion needs its session_id")
            try:
                sequences = await fetch(c.session_id, c.session_base_url)
            except Exception as exc:
                # The rollout happened but its tokens are out of reach: an infrastructure failure, unscored.
                log.warning("sequences of session for %s unavailable: %s", c.rollout_id, exc)
                c = c.model_copy(update={"outcome": OutcomeKind.infra_error, "error": f"sequences fetch: {exc}"[:8192]})
        # No await between applying and journaling: a checkpoint can never fall between the two.
        harness = coordinator.harness_of(c.rollout_id)
        ack = coordinator.complete(c, sequences)
        if ack.status == "accepted":
            journal.append(
                JournalEntry(seq=coordinator.state.journal_seq, harness=harness, completion=c, sequences=sequences)
            )
        return ack

    return app
