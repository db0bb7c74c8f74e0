"""The evaluation coordinator: a `LeaseService` over one evaluation ledger, served by the coordinator core's
server (runtime/coordinator/server.py) with the same protocol as the learner's, so unmodified runners serve it.

`POST /v1/leases`, renew, release, `POST /v1/completions`, `GET /v1/status`, plus `GET /v1/results` for
`harnessrl eval`. A completion is journaled (runtime/coordinator/journal.py) before it is acked; a restarted
coordinator replays the journal and goes on where it stopped; the results file is written once every rollout
is final.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI
from harnessrl.runtime import logs, serving
from harnessrl.runtime.contracts.coordinator import (
    AckStatus,
    Completion,
    CompletionAck,
    Lease,
    LeaseRequest,
    PoolScore,
    read_runner_token,
)
from harnessrl.runtime.coordinator import leases
from harnessrl.runtime.coordinator import ledger as L
from harnessrl.runtime.coordinator.journal import Journal
from harnessrl.runtime.coordinator.server import create_app as core_app
from harnessrl.runtime.coordinator.service import replay
from harnessrl.runtime.evaluation.config import EvalConfig
from harnessrl.runtime.trajectory.models import TrainingSequence
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
    """One evaluation's ledger (pure) plus its journal and results file (the I/O)."""

    def __init__(self, config: EvalConfig) -> None:
        self.config = config
        self.lease_ttl_s = config.lease_ttl_s
        self.ledger = L.plan_ledger(config.pools, config.task_ids, config.attempts)
        self.applied = 0
        self.journal = Journal(config.journal)
        replay(self, self.journal)
        if self.done:
            self.write_results()

    # -- LeaseService (runtime/coordinator/service.py) ------------------------------------------------------

    @property
    def done(self) -> bool:
        return L.done(self.ledger)

    @property
    def journal_seq(self) -> int:
        return self.applied

    def lease(self, req: LeaseRequest, now: float) -> list[Lease]:
        c = self.config
        return L.lease(self.ledger, req, now, c.lease_ttl_s, c.model, c.proxy_url, c.policy_version, c.max_unscored)

    def renew(self, lease_ids: list[str], now: float) -> list[str]:
        return leases.renew(self.ledger.slots.values(), set(lease_ids), now + self.config.lease_ttl_s)

    def release(self, runner_id: str, pool: str) -> int:
        return leases.release((s for s in self.ledger.slots.values() if s.pool == pool), runner_id)

    def check(self, c: Completion) -> CompletionAck | None:
        return L.duplicate_ack(self.ledger, c)

    def count_duplicate(self) -> None:
        self.ledger.duplicates += 1

    def trains_on(self, rollout_id: str) -> bool:
        return False

    def harness_of(self, rollout_id: str) -> str:
        slot = self.ledger.slots.get(rollout_id)
        return slot.harness if slot is not None else ""

    def complete(self, c: Completion, sequences: list[TrainingSequence]) -> CompletionAck:
        ack = L.complete(self.ledger, c, self.config.max_unscored)
        if ack.status == AckStatus.accepted:
            self.applied += 1
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

    # -- results --------------------------------------------------------------------------------------------

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

    def write_results(self) -> None:
        path = self.config.results
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(self.results().model_dump_json(indent=2) + "\n")
        tmp.replace(path)
        log.info("evaluation of %s done: results in %s", self.config.label, path)

    def committed(self) -> None:
        """After each journaled completion: the results file once the last rollout is final."""
        if self.done:
            self.write_results()

    def close(self) -> None:
        self.journal.close()


def create_app(coordinator: EvalCoordinator, clock: Callable[[], float] = time.time) -> FastAPI:
    """The coordinator core's server over this evaluation, plus `GET /v1/results`."""
    app = core_app(coordinator, coordinator.journal, read_runner_token(coordinator.config.runner_token_file),
                   retry_after_s=coordinator.config.retry_after_s, clock=clock,
                   title="harnessrl eval coordinator")

    @app.get("/v1/results", response_model=EvalResults)
    async def results() -> EvalResults:
        return coordinator.results()

    return app


def serve_forever(config: EvalConfig) -> None:
    """Serve until SIGTERM/SIGINT (uvicorn's own handlers). `harnessrl eval` stops it once it has the results."""
    coordinator = EvalCoordinator(config)
    try:
        serving.server(create_app(coordinator), config.host, config.port).run()
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
    logs.configure(config.log_level)
    serve_forever(config)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
