"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does: several operator
replicas run, one reconciles.

A candidate takes the Lease when it is free or its holder stopped renewing it for `leaseDurationSeconds` (timed
on this replica's own clock from when it last saw the record change, so clock skew between nodes does not
matter); the leader renews it every `retry_period_s` and stops leading when it could not renew for
`renew_deadline_s`, which is shorter than the lease, so it stops before anyone else may start. Every write is
a compare-and-swap on the Lease's resourceVersion. A leader that shuts down releases the Lease, so a standby
takes over at its next try instead of after a whole lease duration.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict, Field, model_validator

log = logging.getLogger("harnessrl.operator.control.leader")
LEASE_API = "coordination.k8s.io/v1"
Manifest = dict[str, Any]


class LeaderElection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    namespace: str = Field(description="namespace of the Lease (the operator's own)")
    lease_name: str = "harnessrl-operator"
    identity: str = Field(default_factory=lambda: f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}")
    lease_duration_s: float = Field(15.0, gt=0, description="how long a holder that stopped renewing keeps it")
    renew_deadline_s: float = Field(10.0, gt=0, description="a leader that could not renew this long stops leading")
    retry_period_s: float = Field(2.0, gt=0, description="between tries to take or renew the Lease")

    @model_validator(mode="after")
    def _deadlines(self) -> LeaderElection:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("leader election needs retry period < renew deadline < lease duration")
        return self


def micro_time(at: datetime) -> str:
    """A metav1.MicroTime, as the API server stores a Lease's times."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_spec(config: LeaderElection, holder: str, now: datetime, acquired: str | None, transitions: int) -> Manifest:
    return {
        "holderIdentity": holder,
        "leaseDurationSeconds": max(1, round(config.lease_duration_s)),
        "acquireTime": acquired or micro_time(now),
        "renewTime": micro_time(now),
        "leaseTransitions": transitions,
    }


class Elector:
    """Tries to take or keep the Lease every retry period; calls `on_started` when this replica becomes the
    leader and `on_stopped` when it no longer is."""

    def __init__(self, kube: Any, config: LeaderElection, on_started: Callable[[], None], on_stopped: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube, self.config = kube, config
        self.on_started, self.on_stopped = on_started, on_stopped
        self.clock = clock
        self.leading = False
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="harnessrl-leader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop trying; a leader stops leading and releases the Lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.renew_deadline_s)
        if self.leading:
            self._step_down()
            self.release()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.config.retry_period_s)

    def tick(self) -> None:
        try:
            held = self.try_acquire_or_renew()
        except Exception as exc:  # the API is unreachable: keep leading until the renew deadline
            log.warning("leader election: cannot reach the Lease %s/%s: %s", self.config.namespace,
                        self.config.lease_name, exc)
            held = None
        now = self.clock()
        if held:
            self._renewed_at = now
            if not self.leading:
                self.leading = True
                log.info("leader election: %s leads (Lease %s/%s)", self.config.identity, self.config.namespace,
                         self.config.lease_name)
                self.on_started()
        elif self.leading and (held is False or now - self._renewed_at > self.config.renew_deadline_s):
            log.warning("leader election: %s lost the Lease %s/%s; it stops reconciling", self.config.identity,
                        self.config.namespace, self.config.lease_name)
            self._step_down()

    def _step_down(self) -> None:
        self.leading = False
        self.on_stopped()

    def try_acquire_or_renew(self) -> bool:
        """One compare-and-swap on the Lease: True when this replica holds it afterwards."""
        config, now = self.config, datetime.now(UTC)
        live = self.kube.get(LEASE_API, "Lease", config.namespace, config.lease_name)
        if live is None:
            body = {"apiVersion": LEASE_API, "kind": "Lease",
                    "metadata": {"name": config.lease_name, "namespace": config.namespace},
                    "spec": lease_spec(config, config.identity, now, None, 0)}
            return self._write(lambda: self.kube.create(body))
        spec = live.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()
        duration = float(spec.get("leaseDurationSeconds") or config.lease_duration_s)
        if holder and holder != config.identity and self.clock() < self._observed_at + duration:
            return False  # another replica holds it and renews it
        ours = holder == config.identity
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if ours else 1)
        live["spec"] = lease_spec(config, config.identity, now, spec.get("acquireTime") if ours else None, transitions)
        return self._write(lambda: self.kube.replace(live))

    def _write(self, write: Callable[[], Manifest]) -> bool:
        try:
            written = write()
        except ApiException as exc:
            if exc.status == 409:  # another replica wrote first
                return False
            raise
        spec = written.get("spec") or {}
        self._observed, self._observed_at = (spec.get("holderIdentity") or "", str(spec.get("renewTime") or "")), self.clock()
        return True

    def release(self) -> None:
        """Hand the Lease back (no holder, a 1 s duration), so a standby takes it at its next try."""
        try:
            live = self.kube.get(LEASE_API, "Lease", self.config.namespace, self.config.lease_name)
            if live is not None and (live.get("spec") or {}).get("holderIdentity") == self.config.identity:
                live["spec"] = live["spec"] | {"holderIdentity": "", "leaseDurationSeconds": 1}
                self.kube.replace(live)
                log.info("leader election: %s released the Lease", self.config.identity)
        except Exception as exc:  # the Lease then expires on its own
            log.warning("leader election: could not release the Lease: %s", exc)


def default_namespace() -> str:
    """The operator's own namespace: the chart sets POD_NAMESPACE; a Pod's ServiceAccount mount says it too."""
    env = os.environ.get("POD_NAMESPACE")
    if env:
        return env
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return "default"
