"""ProxyConfig: everything `harnessrl proxy --config FILE` needs (YAML or JSON file, rendered by the operator)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from harnessrl.runtime.contracts.coordinator import read_runner_token
from harnessrl.runtime.contracts.server_limits import ServerLimits
from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator


# The port layout of a replica with worker processes (runtime/proxy/workers.py): the operator opens these ports.
def worker_port(replica_port: int, index: int) -> int:
    return replica_port + 1 + index


def worker_ports(replica_port: int, workers: int) -> list[int]:
    """The workers' own ports, after the replica's (none for a replica of one process, which serves at its port)."""
    return [worker_port(replica_port, k) for k in range(workers)] if workers > 1 else []


class UpstreamLimits(BaseModel):
    """Connection pool of the one shared upstream HTTP client (httpx defaults were the reference's bottleneck)."""

    model_config = ConfigDict(extra="forbid")

    # Calls beyond this many open connections wait (up to pool_timeout_s) for one to come back.
    max_connections: int = Field(1024, ge=1, le=100_000)
    # Well below the engine's own keep-alive timeout (vLLM/uvicorn: 5 s, counted from when it sent the answer; a
    # busy proxy reads it later), so the proxy seldom reuses a connection the engine is closing.
    keepalive_expiry_s: float = Field(3.0, gt=0)
    connect_timeout_s: float = Field(10.0, gt=0)
    # A long generation may take minutes; the read timeout bounds silence between bytes, not the whole call.
    read_timeout_s: float = Field(600.0, gt=0)
    pool_timeout_s: float = Field(30.0, gt=0)


class AdmissionLimits(BaseModel):
    """Bounded work instead of unbounded queues: beyond these, callers get an overloaded error + Retry-After."""

    model_config = ConfigDict(extra="forbid")

    max_inflight_calls: int = Field(4096, ge=1)
    max_inflight_per_engine: int = Field(2048, ge=1)
    max_sessions: int = Field(100_000, ge=1)
    retry_after_s: int = Field(2, ge=1, le=3600)


class WorkerHealth(BaseModel):
    """How the supervisor of a multi-worker replica tells a hung worker from a busy one. Each worker's event loop
    writes a byte to a pipe from the supervisor every `interval_s`, from a timer callback: a loop runs its due
    timers on every iteration however many calls wait, so a saturated worker still beats and a stuck loop does
    not. A worker that has beaten since its start and then misses `failures_allowed` intervals in a row is killed
    and restarted from its journal, and so is one that has not beaten yet `startup_timeout_s` after its start
    (stuck replaying its journal: its listening socket is open from the start, so the kernel queues connections to
    the replica's port on it that nothing answers). An answer to a request would not do as the sign of life:
    under overload a call waits seconds for the loop, and a probe with it, so a busy worker was taken for a hung
    one and killed, and every session it held failed while it restarted (5,000 sessions on 2 workers). Kubernetes' probes reach the replica's shared port, where the kernel picks a worker per connection,
    so they cannot tell which one hung either."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(1.0, gt=0)
    failures_allowed: int = Field(10, ge=1)
    startup_timeout_s: float = Field(300.0, gt=0)


class ProxyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "0.0.0.0"
    port: int = Field(8080, ge=0, le=65535)
    # The stable URL of THIS replica (StatefulSet pod DNS in a cluster); returned by POST /sessions so the
    # harness talks to the replica that owns its session, without a shared store or sticky load balancer.
    public_base_url: HttpUrl | None = None
    replica_id: str = Field("proxy-0", min_length=1, max_length=253, pattern=r"^[A-Za-z0-9._-]+$")
    upstream_urls: list[HttpUrl] = Field(min_length=1, max_length=64)
    # Policy the proxy samples from: the served base model, or a LoRA adapter `<name>-v<N>` set via PUT /policy.
    served_model: str = Field(min_length=1, max_length=512)
    policy_version: int = Field(0, ge=0)
    # File holding the admin bearer token (a mounted Secret). The token itself is never logged.
    admin_token_file: Path
    # File holding the run's runner token: it opens the session routes a runner needs (create, read, close a
    # session) and nothing else, so runner pods hold no admin credential. None: the admin token only.
    runner_token_file: Path | None = None
    # File holding the engines' API key (an EnginePool's servers require one: runtime/engine/api_key.py).
    engine_api_key_file: Path | None = None
    journal_dir: Path
    session_ttl_s: float = Field(6 * 3600.0, gt=0)
    call_budget_default: int = Field(200, ge=1, le=100_000)
    # Upper bound on every call's completion tokens (None: the caller's max_tokens, else the context limit).
    max_tokens_per_call: int | None = Field(None, ge=1, le=1_048_576)
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    # The temperature training sessions sample at (the run's grpo temperature; the learner scores at the same).
    temperature: float = Field(1.0, gt=0.0, le=2.0)
    # A seeded run's seed (spec.grpo.seededSampling): each call carries a seed derived from it, the rollout and the
    # call's index (seeding.py), so it repeats token for token under the same policy. None: vLLM's own sampling.
    sampling_seed: int | None = Field(None, ge=0, le=2_147_483_647)
    # Token splicing (splicing.py) where the engine serves vLLM's render endpoints. Off: a resent reply is sent as
    # the harness wrote it, as without splicing (benchmarks/trajectory compares the two).
    splice: bool = True
    upstream: UpstreamLimits = UpstreamLimits()
    admission: AdmissionLimits = AdmissionLimits()
    # Journal durability: fsync each turn (True) or only flush to the OS (survives a process kill, not a host crash).
    journal_fsync: bool = True
    # Group commit: how long an fsync may wait for calls in flight to append their records too (journal.py): less
    # CPU per call, more latency; off by default.
    journal_commit_delay_s: float = Field(0.0, ge=0, le=1.0)
    log_level: str = Field("info", pattern=r"^(debug|info|warning|error)$")
    # The allocator `harnessrl proxy` runs on (allocator.py): mimalloc, preloaded where it is installed (less CPU
    # per call and memory per session than glibc's malloc), or the system's.
    allocator: Literal["mimalloc", "system"] = "mimalloc"
    # Worker processes of this replica (workers.py): one event loop serves ~one core's worth of calls, so a
    # replica with more cores runs one worker per core; worker K serves its own sessions at `port + 1 + K`.
    # Pays where a replica has spare cores: one worker carried 500 calls/s in half a core; a second cut the p99 it
    # added at 1,000 sessions @ 2 s from 28-52 to ~11 ms, for ~12% more CPU per call (benchmarks/proxy/README.md, History).
    workers: int = Field(1, ge=1, le=64)
    # Ports of this proxy's other replicas where they differ from this one's (replicas on one host): a call for a
    # session another replica owns is relayed only to this replica's port, its workers' ports and these (relay.py).
    relay_ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(default_factory=list, max_length=1024)
    worker_health: WorkerHealth = WorkerHealth()
    # Each connection's request head: its size and the time it may take (runtime/serving.py); 75 s keep-alive.
    http: ServerLimits = ServerLimits()

    @model_validator(mode="after")
    def _worker_ports(self) -> ProxyConfig:
        if self.workers > 1 and not 0 < self.port <= 65535 - self.workers:
            raise ValueError(f"workers: {self.workers} need a fixed port with ports {self.port}+1..+{self.workers} free "
                             "for the workers' own sessions")
        return self

    @field_validator("upstream_urls")
    @classmethod
    def _distinct(cls, urls: list[HttpUrl]) -> list[HttpUrl]:
        if len({str(u) for u in urls}) != len(urls):
            raise ValueError("upstream_urls must be distinct")
        return urls

    def base_url(self) -> str:
        """The URL harnesses of sessions owned by this replica should use (no trailing slash)."""
        if self.public_base_url is not None:
            return str(self.public_base_url).rstrip("/")
        return f"http://{self.local_host()}:{self.port}"

    def local_host(self) -> str:
        """Where a process on this host reaches the proxy (loopback when it listens on every address)."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host

    def read_admin_token(self) -> str:
        token = self.admin_token_file.read_text().strip()
        if not token:
            raise ValueError(f"admin token file {self.admin_token_file} is empty")
        return token

    def read_runner_token(self) -> str | None:
        return read_runner_token(self.runner_token_file) if self.runner_token_file is not None else None


def load_config(path: Path) -> ProxyConfig:
    """Read a ProxyConfig from a YAML (or JSON, a YAML subset) file."""
    data = yaml.safe_load(Path(path).read_text())
    return ProxyConfig.model_validate(data or {})
