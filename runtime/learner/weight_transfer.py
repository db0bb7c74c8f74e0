"""Full-weight sync over vLLM's weight-transfer API (backend "nccl"): one transfer group per engine replica.

Per publish: pause every replica (mode "keep": in-flight harness calls freeze and continue after resume) →
for each replica, open its group if it has none (ask the engine its world size, tensor parallel × pipeline ×
data parallel; shut down any group an earlier learner left; `init_weight_transfer_engine` while this process
joins the rendezvous as rank 0) → `start_weight_update` → `update_weights` concurrently with the broadcast →
`finish_weight_update` with the version → resume every replica. The transfer itself is vLLM's own trainer
engine (`NCCLTrainerWeightTransferEngine`); this module owns the HTTP client it drives, the groups, timeouts
and failures.

Why a group per replica rather than one broadcast group: vLLM's trainer engine puts every worker of an init
at rank offset 1, so replicas cannot share a group without rewriting its payload, and an engine that
restarts needs only its own group rebuilt. Replica i rendezvous on `nccl_master_port + i`.

Failures: a refused request (HTTP 400/422) or a missing API (404) ends the run with a reason
(`LearnerFailure`); a dead or restarting engine (connection error, 5xx) is a `WeightSyncError` the learner
retries, and the replica's group is rebuilt on the next try; a transfer that outlives `sync_timeout_s` is
`WeightSyncHung` (NCCL cannot be cancelled: the process restarts from its checkpoint).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from harnessrl.runtime.contracts.learner_config import EngineLink
from harnessrl.runtime.contracts.learner_exit import (
    WEIGHT_SYNC_ADDRESS,
    WEIGHT_SYNC_HUNG,
    WEIGHT_SYNC_REJECTED,
    WEIGHT_SYNC_UNSUPPORTED,
    LearnerFailure,
)
from harnessrl.runtime.contracts.proxy import PolicyState
from harnessrl.runtime.engine.lora import server_root

log = logging.getLogger(__name__)
T = TypeVar("T")


class WeightSyncError(RuntimeError):
    """A publish failed in a way a retry can fix (an engine restarting, a dropped connection)."""


class EngineWeightClient:
    """vLLM's weight-sync control plane of one engine over HTTP (the `VLLMWeightSyncClient` protocol that
    vLLM's trainer engines drive, plus pause/resume, world size and weight version), with timeouts."""

    def __init__(self, url: str, timeout_s: float, transfer_timeout_s: float):
        self.root = server_root(url)
        self.timeout_s = timeout_s
        # init blocks on the rendezvous and update_weights on the whole broadcast: they get the transfer's time.
        self.transfer_timeout_s = transfer_timeout_s
        self.http = httpx.Client()
        self.version: str | None = None  # sent with finish_weight_update: the engine reports it at /weight_info

    def _call(self, method: str, path: str, *, long: bool = False, **kwargs: Any) -> dict[str, Any]:
        url = f"{self.root}/{path}"
        timeout = self.transfer_timeout_s if long else self.timeout_s
        try:
            r = self.http.request(method, url, timeout=timeout, **kwargs)
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        if r.status_code == 404:
            raise LearnerFailure(WEIGHT_SYNC_UNSUPPORTED, f"{method} {url} -> 404: the engine does not serve vLLM's "
                                 "weight-transfer API (it needs VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config "
                                 "'{\"backend\":\"nccl\"}')")
        if r.status_code in (400, 422):
            raise LearnerFailure(WEIGHT_SYNC_REJECTED, f"{method} {url} -> {r.status_code}: {r.text[:500]}")
        if r.status_code != 200:
            raise WeightSyncError(f"{method} {url} -> {r.status_code}: {r.text[:500]}")
        body = r.json()
        return body if isinstance(body, dict) else {}

    def world_size(self) -> int:
        """Workers that join the transfer group: tensor × pipeline × data parallel."""
        return int(self._call("GET", "get_world_size", params={"include_dp": "true"})["world_size"])

    def weight_version(self) -> str | None:
        return self._call("GET", "weight_info").get("weight_version")

    def pause(self) -> None:
        self._call("POST", "pause", params={"mode": "keep"})

    def resume(self) -> None:
        self._call("POST", "resume")

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._call("POST", "init_weight_transfer_engine", json={"init_info": init_info}, long=True)

    def shutdown_weight_transfer_engine(self) -> None:
        self._call("POST", "shutdown_weight_transfer_engine")

    def start_weight_update(self) -> None:
        self._call("POST", "start_weight_update")

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._call("POST", "update_weights", json={"update_info": update_info}, long=True)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._call("POST", "finish_weight_update", json={"weight_version": weight_version or self.version},
                   long=True)


def trainer_init_info(info_type: type, address: str, port: int, engine_world_size: int) -> Any:
    """The trainer's side of the group: rank 0 (the sender, vLLM's keyword-only `rank`), and the engine's
    workers after it."""
    return info_type(master_address=address, master_port=port, world_size=1 + engine_world_size, rank=0)


def own_address(engine: EngineLink) -> str:
    """The rendezvous address, checked to be on this process's interfaces: vLLM binds rank 0's listening socket
    to it (`StatelessProcessGroup.create`), which fails with EADDRNOTAVAIL on any other address, a Service's
    ClusterIP included: said at start, with a reason, instead of as an OSError at the first publish."""
    try:
        address = engine.rendezvous_address()
    except ValueError as exc:
        raise LearnerFailure(WEIGHT_SYNC_ADDRESS, str(exc)) from exc
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except OSError as exc:
        raise LearnerFailure(WEIGHT_SYNC_ADDRESS, f"engine.nccl_master_address {address!r} is not an address of "
                             f"this process ({exc}): the rendezvous binds to it, so it must be the Pod's own IP"
                             ) from exc
    return address


def nccl_init_info_type() -> type:
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    return NCCLTrainerInitInfo


def run_with_timeout(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run `fn` in a daemon thread and wait at most `timeout_s`: a collective whose peer died never returns,
    and a daemon thread does not hold the process at exit."""
    out: list[T] = []
    err: list[BaseException] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the caller's thread
            err.append(exc)

    t = threading.Thread(target=target, name=f"weight-transfer {what}", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise LearnerFailure(WEIGHT_SYNC_HUNG, f"{what} did not finish in {timeout_s:.0f}s", restartable=True)
    if err:
        raise err[0]
    return out[0]


@dataclass
class Replica:
    client: EngineWeightClient
    port: int
    transfer: Any = None  # vLLM's trainer engine while the group is open


class NcclSync:
    """Full weights to every engine replica over vLLM's weight transfer (GPU; `init_info_type` selects
    another registered backend, as a test does to run the same path on CPU)."""

    replaces_weights = True  # the engines' own weights are overwritten: v0 is pushed as any version

    def __init__(self, engine: EngineLink, served_name: str, init_info_type: type | None = None):
        self.engine = engine
        self.served = served_name
        self.address = own_address(engine)  # at start, not at the first publish minutes later
        self.replicas = [
            Replica(EngineWeightClient(url, engine.request_timeout_s, engine.sync_timeout_s), engine.nccl_master_port + i)
            for i, url in enumerate(engine.urls)
        ]
        self.init_info_type = init_info_type
        self.model: Any = None  # kept from the last publish, to push it again to an engine that restarted
        self.lock = threading.Lock()

    def publish(self, model: Any, version: int) -> PolicyState:
        with self.lock:
            self.model = model
            self._push(self.replicas, version)
        return PolicyState(model=self.served, version=version)

    def retire(self, version: int) -> None:
        pass  # full weights own their engines: nothing to hand back to other runs

    def restore(self, version: int) -> list[str]:
        """Push the current weights again to replicas whose engine does not report `version` (restarted on
        its checkpoint): their old group died with them, so it is rebuilt."""
        with self.lock:
            if self.model is None:
                return []
            stale = [r for r in self.replicas if r.client.weight_version() != str(version)]
            for r in stale:
                self._close(r)
            if stale:
                self._push(stale, version)
            return [r.client.root for r in stale]

    def _push(self, replicas: list[Replica], version: int) -> None:
        paused: list[Replica] = []
        try:
            for r in replicas:
                r.client.pause()
                paused.append(r)
            for r in replicas:
                r.client.version = str(version)
                try:
                    if r.transfer is None:
                        r.transfer = self._open(r)
                    run_with_timeout(r.transfer.send_weights, self.engine.sync_timeout_s,
                                     f"sending policy v{version} to {r.client.root}")
                except BaseException:
                    self._close(r)  # the group's state is unknown: rebuild it on the next try
                    raise
        except BaseException:
            self._resume(paused, quiet=True)
            raise
        self._resume(paused)

    def _open(self, r: Replica) -> Any:
        info_type = self.init_info_type
        if info_type is None:
            import torch

            if not torch.cuda.is_available():
                raise LearnerFailure(WEIGHT_SYNC_UNSUPPORTED, "engine.sync 'nccl' needs a CUDA device in the learner")
            info_type = nccl_init_info_type()
        from vllm.distributed.weight_transfer.base import ModuleSource
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        info = trainer_init_info(info_type, self.address, r.port, r.client.world_size())
        # A group an earlier learner process opened with this engine is dead: the engine drops it first.
        r.client.shutdown_weight_transfer_engine()
        # The fused-head patch leaves parameter names as in the HF checkpoint, which vLLM's loader expects.
        source = ModuleSource(self.model)
        return run_with_timeout(
            lambda: WeightTransferTrainerFactory.trainer_init(info, client=r.client, source=source),
            self.engine.sync_timeout_s,
            f"opening the weight-transfer group with {r.client.root}",
        )

    def _close(self, r: Replica) -> None:
        transfer, r.transfer = r.transfer, None
        if transfer is not None:
            try:
                transfer.shutdown()
            except Exception as exc:  # a broken communicator may fail to tear down; it is dropped either way
                log.info("closing the weight-transfer group with %s: %s", r.client.root, exc)

    def _resume(self, paused: list[Replica], quiet: bool = False) -> None:
        """Resume every paused replica, even when one fails; re-raise the first failure after trying all
        (unless `quiet`: the publish already failed for another reason)."""
        first: Exception | None = None
        for r in paused:
            try:
                r.client.resume()
            except Exception as exc:  # an engine that died is not paused any more; others must still resume
                log.warning("resuming %s: %s", r.client.root, exc)
                first = first or exc
        if first is not None and not quiet:
            raise first
