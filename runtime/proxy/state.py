"""The proxy's state, one per process: its sessions (each with its call graph), the journal every change to them
is written to, the engines and the upstream client, the calls in flight and the pause gate.

The admin API (admin.py) and the dialect-call path (calls.py) both act through it. Building it replays the journal
(synchronous, at startup); `running` holds its background work (the sweeper, the worker heartbeat) for as long as
the app serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from harnessrl.runtime.contracts.proxy import CreateSessionRequest, PolicyState
from harnessrl.runtime.contracts.proxy_config import ProxyConfig
from harnessrl.runtime.engine.api_key import engine_headers
from harnessrl.runtime.proxy.engines import EngineClient, EnginePool, make_client
from harnessrl.runtime.proxy.gc_policy import COLLECTOR
from harnessrl.runtime.proxy.journal import Journal, read_records
from harnessrl.runtime.proxy.metrics import ProxyMetrics
from harnessrl.runtime.proxy.relay import owner_address
from harnessrl.runtime.proxy.sessions import Session, SessionStore
from harnessrl.runtime.proxy.upstream_http import UpstreamPool
from harnessrl.runtime.proxy.workers import WorkerRole, proxy_ports


class ReplicaFull(Exception):
    """This replica holds `admission.max_sessions` already."""


@dataclass
class ProxyState:
    config: ProxyConfig
    admin_token: str
    runner_token: str | None  # opens the session routes only (admin.py)
    store: SessionStore
    journal: Journal
    pool: EnginePool
    http: UpstreamPool
    client: EngineClient
    metrics: ProxyMetrics
    inflight: int = 0
    # Set = calls flow; cleared by POST /admin/pause while weights move (new calls wait, in-flight ones finish).
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    ended_since_compaction: int = 0
    # Which worker of its replica this is, when it is one of several (workers.py): replica-wide admin writes
    # are forwarded to the others, and /metrics gathers theirs.
    role: WorkerRole | None = None
    # The ports of this proxy a call may be relayed to (relay.py); never another port, however the key names it.
    relay_ports: frozenset[int] = frozenset()

    @property
    def policy(self) -> PolicyState:
        assert self.store.policy is not None
        return self.store.policy

    async def durable(self, record: dict[str, Any]) -> None:
        started = time.perf_counter()
        await self.journal.append(record)
        self.metrics.journal_latency.observe(time.perf_counter() - started)

    def call_started(self) -> None:
        self.inflight += 1
        self.metrics.inflight.inc()

    def call_ended(self) -> None:
        self.inflight -= 1
        self.metrics.inflight.dec()

    async def create_session(self, request: CreateSessionRequest) -> Session:
        """A new session, durable before it is returned; ReplicaFull at `admission.max_sessions`."""
        if len(self.store) >= self.config.admission.max_sessions:
            raise ReplicaFull
        session, record = self.store.create(request)
        await self.durable(record)
        self.metrics.sessions_created.inc()
        self.metrics.sessions_live.set(len(self.store))
        return session

    async def end_session(self, session_id: str, reason: str) -> None:
        _, record = self.store.end(session_id, reason)
        await self.durable(record)
        self.ended_since_compaction += 1
        self.metrics.sessions_ended.labels(reason).inc()
        self.metrics.sessions_live.set(len(self.store))

    async def set_policy(self, policy: PolicyState) -> None:
        await self.durable(self.store.set_policy(policy))
        self.metrics.policy_version.set(policy.version)

    async def sweep(self) -> None:
        """Expire sessions idle past the TTL; compact the journal once as many sessions have ended as are live (at
        least 100); when one is due, a full garbage collection (gc_policy.py)."""
        for sid in self.store.expired(time.time()):
            await self.end_session(sid, "expired")
        if self.ended_since_compaction >= max(100, len(self.store)):
            self.ended_since_compaction = 0
            await self.journal.compact(self.store.keeps)
        COLLECTOR.collect_if_due()

    async def _sweeping(self) -> None:
        interval = min(60.0, max(0.5, self.config.session_ttl_s / 10))
        while True:
            await asyncio.sleep(interval)
            await self.sweep()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Compact the journal to the live sessions, then sweep (and beat, at a worker) until the app stops; the
        upstream client and the journal are closed then."""
        await self.journal.compact(self.store.keeps)
        gc.freeze()  # what startup built (modules, rebuilt sessions) lives on: keep it out of every collection
        sweeper = asyncio.create_task(self._sweeping())
        heartbeat = self.role.heartbeat if self.role is not None else None
        if heartbeat is not None:
            heartbeat.start()  # from here on the supervisor expects a beat every interval
        try:
            yield
        finally:
            if heartbeat is not None:
                heartbeat.stop()
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await self.http.close()
            self.journal.close()


def build_state(config: ProxyConfig, role: WorkerRole | None) -> ProxyState:
    """Open the journal and rebuild this replica's sessions from it, expired ones ended (synchronous, at startup)."""
    store = SessionStore(default_budget=config.call_budget_default, ttl_s=config.session_ttl_s,
                         owner=owner_address(config.base_url()))
    path = config.journal_dir / f"{config.replica_id}.jsonl"
    for record in read_records(path):
        store.replay(record)
    for sid in store.expired(time.time()):
        store.end(sid, "expired")
    if store.policy is None:
        store.policy = PolicyState(model=config.served_model, version=config.policy_version)
    http = make_client(config.upstream)
    metrics = ProxyMetrics()
    metrics.sessions_live.set(len(store))
    metrics.policy_version.set(store.policy.version)
    state = ProxyState(
        config=config,
        admin_token=config.read_admin_token(),
        runner_token=config.read_runner_token(),
        store=store,
        journal=Journal(path, fsync=config.journal_fsync),
        pool=EnginePool.from_urls([str(u) for u in config.upstream_urls]),
        http=http,
        client=EngineClient(http, config.admission.retry_after_s, engine_headers(config.engine_api_key_file)),
        metrics=metrics,
        role=role,
        relay_ports=role.ports if role is not None else proxy_ports(config),
    )
    state.flowing.set()
    state.journal.hold_commits(config.journal_commit_delay_s, lambda: state.inflight)
    return state
