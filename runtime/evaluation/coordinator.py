"""The eval coordinator: the ledger plus its journal and results file (the only I/O), and its HTTP surface.

It speaks the learner's runner protocol (runtime/contracts/coordinator.py) so unmodified runners serve it:
`POST /v1/leases`, `POST /v1/completions`, plus `GET /v1/status` and `GET /v1/results` for `harnessrl eval`.
A completion is journaled before it is acked; a restarted coordinator replays the journal.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI, HTTPException
from harnessrl.runtime.contracts.coordinator import (
    AckStatus,
    Completion,
    CompletionAck,
    LeaseRelease,
    LeaseReleaseResponse,
    LeaseRenewal,
    LeaseRenewalResponse,
    LeaseRequest,
    LeaseResponse,
    PoolScore,
    renew_every,
)
from harnessrl.runtime.evaluation import ledger as L
from harnessrl.runtime.evaluation.config import EvalConfig
from pydantic import BaseModel

log = logging.getLogger(__name__)


class EvalStatus(BaseModel):
    label: str
    done: bool
    rollouts: int
    leased: int
    scored: int
    unscored: int
    leases_expired: int
    duplicates: int
    pools: list[PoolScore]


class EvalResults(EvalStatus):
    model: str
    policy_version: int
    attempts: int
    tasks: int
    slots: list[L.Slot]


class EvalCoordinator:
    def __init__(self, config: EvalConfig) -> None:
        self.config = config
        self.ledger = L.plan_ledger(config.pools, config.task_ids, config.attempts)
        self._replay()
        config.journal.parent.mkdir(parents=True, exist_ok=True)
        self._journal = config.journal.open("a")
        if L.done(self.ledger):
            self._write_results()

    def _replay(self) -> None:
        if not self.config.journal.exists():
            return
        n = 0
        for line in self.config.journal.read_text().splitlines():
            if line.strip():
                L.complete(self.ledger, Completion.model_validate_json(line), self.config.max_unscored)
                n += 1
        log.info("replayed %d completions from %s", n, self.config.journal)

    def lease(self, req: LeaseRequest, now: float) -> LeaseResponse:
        if L.done(self.ledger):
            return LeaseResponse(done=True, retry_after_s=0)
        c = self.config
        leases = L.lease(self.ledger, req, now, c.lease_ttl_s, c.model, c.proxy_url, c.policy_version, c.max_unscored)
        return LeaseResponse(
            leases=leases, retry_after_s=0 if leases else c.retry_after_s, renew_every_s=renew_every(c.lease_ttl_s)
        )

    def release(self, req: LeaseRelease) -> LeaseReleaseResponse:
        mine = (s for s in self.ledger.slots.values() if s.pool == req.pool)
        return LeaseReleaseResponse(released=L.release(mine, req.runner_id))

    def renew(self, req: LeaseRenewal, now: float) -> LeaseRenewalResponse:
        return LeaseRenewalResponse(renewed=L.renew(self.ledger.slots.values(), set(req.lease_ids), now + self.config.lease_ttl_s))

    def complete(self, completion: Completion) -> CompletionAck:
        ack = L.complete(self.ledger, completion, self.config.max_unscored)
        if ack.status == AckStatus.accepted:
            self._journal.write(completion.model_dump_json() + "\n")
            self._journal.flush()
            os.fsync(self._journal.fileno())
            if L.done(self.ledger):
                self._write_results()
        return ack

    def status(self) -> EvalStatus:
        slots = self.ledger.slots.values()
        return EvalStatus(
            label=self.config.label,
            done=L.done(self.ledger),
            rollouts=len(slots),
            leased=sum(s.status == L.SlotStatus.leased for s in slots),
            scored=sum(s.status == L.SlotStatus.scored for s in slots),
            unscored=sum(s.status == L.SlotStatus.unscored for s in slots),
            leases_expired=self.ledger.leases_expired,
            duplicates=self.ledger.duplicates,
            pools=L.pool_scores(self.ledger),
        )

    def results(self) -> EvalResults:
        c = self.config
        return EvalResults(
            **self.status().model_dump(),
            model=c.model,
            policy_version=c.policy_version,
            attempts=c.attempts,
            tasks=len(c.task_ids),
            slots=list(self.ledger.slots.values()),
        )

    def _write_results(self) -> None:
        path = self.config.results
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(self.results().model_dump_json(indent=2) + "\n")
        tmp.replace(path)
        log.info("evaluation of %s done: results in %s", self.config.label, path)

    def close(self) -> None:
        self._journal.close()


def create_app(coordinator: EvalCoordinator, clock: Callable[[], float] = time.time) -> FastAPI:
    app = FastAPI(title="harnessrl eval coordinator")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/status", response_model=EvalStatus)
    async def status() -> EvalStatus:
        return coordinator.status()

    @app.get("/v1/results", response_model=EvalResults)
    async def results() -> EvalResults:
        return coordinator.results()

    @app.post("/v1/leases", response_model=LeaseResponse)
    async def lease(req: LeaseRequest) -> LeaseResponse:
        try:
            return coordinator.lease(req, clock())
        except L.EvalError as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from None

    @app.post("/v1/leases/renew", response_model=LeaseRenewalResponse)
    async def renew(req: LeaseRenewal) -> LeaseRenewalResponse:
        return coordinator.renew(req, clock())

    @app.post("/v1/leases/release", response_model=LeaseReleaseResponse)
    async def release(req: LeaseRelease) -> LeaseReleaseResponse:
        return coordinator.release(req)

    @app.post("/v1/completions", response_model=CompletionAck)
    async def complete(c: Completion) -> CompletionAck:
        try:
            return coordinator.complete(c)
        except L.UnknownRollout as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from None

    return app


def serve_forever(config: EvalConfig) -> None:
    """Serve until SIGTERM/SIGINT (uvicorn's own handlers). `harnessrl eval` stops it once it has the results."""
    import uvicorn

    coordinator = EvalCoordinator(config)
    try:
        uvicorn.run(create_app(coordinator), host=config.host, port=config.port, log_level="warning")
    finally:
        coordinator.close()


def main(argv: list[str]) -> int:
    import argparse

    from harnessrl.runtime.evaluation.config import load_config
    from pydantic import ValidationError

    parser = argparse.ArgumentParser(prog="python -m harnessrl.runtime.evaluation.coordinator",
                                     description="serve one pass@1 evaluation to HarnessPool runners")
    parser.add_argument("--config", type=Path, required=True, help="EvalConfig YAML/JSON file")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except (OSError, ValidationError, ValueError) as exc:
        print(f"eval coordinator: bad config {args.config}: {exc}")
        return 2
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve_forever(config)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
