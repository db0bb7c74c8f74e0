"""Leader election on a Lease of the API emulator (operator/control/leader.py), and two `harnessrl operator` processes of
which only the Lease holder reconciles: it hands over on shutdown and is replaced after a crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from harnessrl.operator.control.apply import Kube
from harnessrl.operator.control.leader import LEASE_API, Elector, LeaderElection
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_operator_main import stop_process
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
NS = "default"
pytestmark = pytest.mark.timeout(120)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Candidate:
    def __init__(self, kube: Kube, name: str, clock: Clock) -> None:
        self.events: list[str] = []
        config = LeaderElection(namespace=NS, identity=name, lease_duration_s=15, renew_deadline_s=10, retry_period_s=2)
        self.elector = Elector(kube, config, lambda: self.events.append("started"), lambda: self.events.append("stopped"),
                               clock=clock)


class Unreachable:
    """A Kube whose every call fails as an unreachable API server does."""

    def __getattr__(self, _: str) -> Any:
        def fail(*_: Any, **__: Any) -> Any:
            raise httpx.ConnectError("connection refused")

        return fail


def a_leads_b_waits(kube_api: Any) -> tuple[Clock, Candidate, Candidate]:
    """Two candidates on one clock, each tried once: a took the free Lease, b found it held."""
    clock = Clock()
    kube = Kube(kube_api.client())
    a, b = Candidate(kube, "a", clock), Candidate(kube, "b", clock)
    a.elector.tick()
    b.elector.tick()
    return clock, a, b


def test_one_candidate_leads_and_another_takes_over_only_once_the_lease_expired(kube_api: Any) -> None:
    clock, a, b = a_leads_b_waits(kube_api)
    assert (a.elector.leading, b.elector.leading) == (True, False) and a.events == ["started"]
    lease = kube_api.get(LEASE_API, "Lease", "harnessrl-operator", namespace=NS)
    assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseDurationSeconds"] == 15

    clock.now += 14  # a stopped renewing 14 s ago (on b's clock): still a's
    b.elector.tick()
    assert not b.elector.leading
    clock.now += 2
    b.elector.tick()
    assert b.elector.leading and b.events == ["started"]
    lease = kube_api.get(LEASE_API, "Lease", "harnessrl-operator", namespace=NS)
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    # a comes back: the Lease is b's, so a stops at once (no overlap beyond the pass in flight).
    a.elector.tick()
    assert not a.elector.leading and a.events == ["started", "stopped"]

    # A leader that cannot reach the API keeps leading until its renew deadline, then stops.
    b.elector.kube = Unreachable()
    clock.now += 9
    b.elector.tick()
    assert b.elector.leading
    clock.now += 2
    b.elector.tick()
    assert not b.elector.leading and b.events == ["started", "stopped"]


def test_a_leader_that_shuts_down_hands_the_lease_over_at_once(kube_api: Any) -> None:
    _, a, b = a_leads_b_waits(kube_api)
    a.elector.stop()  # never started its thread: stop() steps down and releases
    assert a.events == ["started", "stopped"]
    b.elector.tick()  # no time passed: the released Lease is free
    assert b.elector.leading


def test_invalid_timings_are_refused() -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        LeaderElection(namespace=NS, lease_duration_s=5, renew_deadline_s=10)


def metric(port: int, name: str) -> float | None:
    """The sum of a metric's samples at an operator's /metrics; None when it does not answer or has none."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
    except httpx.HTTPError:
        return None
    values = [s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]
    return float(sum(values)) if values else None


def test_two_operator_processes_one_leader_handover_and_crash(kube_api: Any, tmp_path: Path) -> None:
    for crd in sorted((ROOT / "crds").glob("*.yaml")):
        kube_api.apply(crd)
    kube_api.apply(ROOT / "examples" / "harnesspools" / "mini-swe-agent.yaml")
    ports = {name: free_port() for name in ("a", "b")}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: tmp_path / f"{name}.log" for name in ports}

    def start(name: str) -> None:
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "harnessrl.cli", "operator", "--standalone", "--namespace", NS,
             "--kubeconfig", str(kube_api.kubeconfig_path), "--resync-seconds", "1",
             "--learner-url-template", "http://127.0.0.1:9", "--leader-elect", "--lease-namespace", NS,
             "--lease-duration-seconds", "4", "--renew-deadline-seconds", "3", "--retry-period-seconds", "0.5",
             "--metrics-port", str(ports[name]), "--log-format", "json"],
            stdout=logs[name].open("w"), stderr=subprocess.STDOUT, env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )

    def leaders() -> list[str]:
        return [n for n in procs if procs[n].poll() is None and metric(ports[n], "harnessrl_operator_leader") == 1.0]

    try:
        start("a")
        kube_api.wait_for(lambda: leaders() == ["a"], timeout=30, interval=0.2)
        start("b")
        kube_api.wait_for(lambda: metric(ports["b"], "harnessrl_operator_leader") == 0.0, timeout=30, interval=0.2)
        kube_api.apply({
            "apiVersion": "harnessrl.io/v1alpha1", "kind": "TrainingRun", "metadata": {"name": "ha-run", "namespace": NS},
            "spec": {"model": {"base": {"hub": {"repo": "Qwen/Qwen3-0.6B"}}}, "tasks": {"hub": {"repo": "a/t"}},
                     "harnesses": [{"pool": "mini-swe-agent"}]},
        })
        kube_api.wait_for(lambda: kube_api.get("batch/v1", "Job", "ha-run-learner", namespace=NS), timeout=30)
        assert leaders() == ["a"] and metric(ports["b"], "harnessrl_operator_reconciles_total") is None  # the standby watched, and reconciled nothing

        procs["a"].send_signal(signal.SIGTERM)  # a rolling update: a releases the Lease on its way out
        assert procs["a"].wait(timeout=20) == 0
        kube_api.wait_for(lambda: leaders() == ["b"], timeout=10, interval=0.2)
        kube_api.delete("batch/v1", "Job", "ha-run-learner", NS)
        kube_api.wait_for(lambda: kube_api.get("batch/v1", "Job", "ha-run-learner", namespace=NS), timeout=30)

        start("a")
        kube_api.wait_for(lambda: metric(ports["a"], "harnessrl_operator_leader") == 0.0, timeout=30, interval=0.2)
        procs["b"].send_signal(signal.SIGKILL)  # a crash: no release; a takes over once the lease expired
        procs["b"].wait(timeout=10)
        kube_api.wait_for(lambda: leaders() == ["a"], timeout=15, interval=0.2)
        lease = kube_api.get(LEASE_API, "Lease", "harnessrl-operator", namespace=NS)
        assert lease["spec"]["leaseTransitions"] >= 2
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                stop_process(proc)
    # Every log line is one JSON object (the chart's --log-format json), none of them a bare traceback.
    for name, path in logs.items():
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        assert lines, name
        for line in lines:
            entry = json.loads(line)
            assert {"time", "level", "logger", "message"} <= entry.keys(), line
