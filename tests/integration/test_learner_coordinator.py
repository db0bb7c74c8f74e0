"""The coordinator over real HTTP (uvicorn on 127.0.0.1), with sequences fetched from a proxy stand-in by the
learner's own ProxyControl client: leases, completions, duplicates, errors in the caller's terms, the journal,
/v1/status and Prometheus /metrics; the runner token on every write; sequences fetched only from the run's own
proxy."""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harnessrl.runtime.contracts.client import bearer
from harnessrl.runtime.contracts.coordinator import Completion, LeaseResponse, OutcomeKind
from harnessrl.runtime.contracts.learner_config import GrpoConfig, HarnessWeight, ProxyLink, RewardConfig
from harnessrl.runtime.coordinator.journal import Journal
from harnessrl.runtime.coordinator.server import create_app
from harnessrl.runtime.learner.coordinator import Coordinator
from harnessrl.runtime.learner.metrics import MetricsSink, StepMetrics
from harnessrl.runtime.learner.schedule import GroupPlanner
from harnessrl.runtime.learner.sync import ProxyControl
from harnessrl.runtime.trajectory.models import TrainingSequence

from tests.fixtures.learner_process import ProxyStandIn
from tests.fixtures.proxy_server import serve_in_thread

RUNNER_TOKEN = secrets.token_urlsafe(16)


class Env:
    def __init__(self, tmp: Path):
        token = secrets.token_urlsafe(12)
        self.proxy = ProxyStandIn("tiny", token)
        self.proxy.start()
        (tmp / "tok").write_text(token)
        self.control = ProxyControl(ProxyLink(url=self.proxy.url, admin_token_file=tmp / "tok"))
        hs = [HarnessWeight(pool="pa", harness="mini", weight=1)]
        self.coord = Coordinator(GroupPlanner(["t0", "t1"], hs, 0, False), GrpoConfig(group_size=2, groups_per_step=1),
                                 RewardConfig(), 30.0, "tiny", self.proxy.url)
        self.journal = Journal(tmp / "journal.jsonl", fsync=False)
        self.sink = MetricsSink(tmp / "metrics.jsonl")
        self.client = httpx.AsyncClient(timeout=10)
        app = create_app(self.coord, self.journal, RUNNER_TOKEN, self.control.fetcher(self.client), self.sink.registry)
        self.server, self.thread, self.url = serve_in_thread(app)

    def session(self, rollout_id: str, n_sampled: int = 2) -> str:
        r = httpx.post(f"{self.proxy.url}/sessions", headers={"authorization": f"Bearer {self.proxy.admin_token}"},
                       json={"rollout_id": rollout_id, "task_id": "t", "harness": "mini", "group_id": "g"})
        sid = str(r.json()["session_id"])
        self.proxy.add_sequence(sid, TrainingSequence(session_id=sid, node_ids=[0], token_ids=[5, 6] + [7] * n_sampled,
                                                      loss_mask=[0, 0] + [1] * n_sampled,
                                                      logprobs=[0.0, 0.0] + [-1.0] * n_sampled,
                                                      policy_versions=[0] * (2 + n_sampled)))
        return sid

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.proxy.stop()
        self.journal.close()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    e.close()


def post(url: str, body: dict[str, Any], token: str | None = RUNNER_TOKEN) -> httpx.Response:
    return httpx.post(url, json=body, timeout=10, headers=bearer(token) if token is not None else {})


def test_lease_complete_duplicate_and_status(env: Env) -> None:
    r = post(f"{env.url}/v1/leases", {"runner_id": "r1", "pool": "pa", "harness": "mini", "max": 3})
    assert r.status_code == 200
    leases = LeaseResponse.model_validate(r.json()).leases
    assert len(leases) == 3 and leases[0].proxy_url == env.proxy.url and leases[0].model == "tiny"
    a, b, c = leases
    sid = env.session(a.rollout_id)
    done = Completion(rollout_id=a.rollout_id, lease_id=a.lease_id, session_id=sid, outcome=OutcomeKind.solved,
                      correctness=1.0, tool_calls=15)
    ack = post(f"{env.url}/v1/completions", done.model_dump(mode="json")).json()
    assert ack == {"rollout_id": a.rollout_id, "status": "accepted", "scored": True, "reward": pytest.approx(1.05)}
    again = post(f"{env.url}/v1/completions", done.model_dump(mode="json")).json()
    assert again["status"] == "duplicate" and again["reward"] == pytest.approx(1.05)
    # The sequences came from the proxy, through the learner's client, and were journaled with the completion.
    [entry] = list(env.journal.entries_after(0))
    assert entry.completion.rollout_id == a.rollout_id and entry.sequences[0].token_ids == [5, 6, 7, 7]
    # An infrastructure failure is unscored and the slot goes back to be leased again.
    infra = Completion(rollout_id=b.rollout_id, lease_id=b.lease_id, outcome=OutcomeKind.infra_error, error="sandbox")
    assert post(f"{env.url}/v1/completions", infra.model_dump(mode="json")).json()["scored"] is False
    # A scored completion whose session the proxy does not know is unscored, not reward 0.
    lost = Completion(rollout_id=c.rollout_id, lease_id=c.lease_id, session_id="nope", outcome=OutcomeKind.wrong)
    lost_ack = post(f"{env.url}/v1/completions", lost.model_dump(mode="json")).json()
    assert lost_ack["status"] == "accepted" and lost_ack["scored"] is False
    st = httpx.get(f"{env.url}/v1/status").json()
    assert st["rollouts_scored"] == 1 and st["rollouts_unscored"] == 2 and st["leased"] == 0
    again_leases = post(f"{env.url}/v1/leases", {"runner_id": "r2", "pool": "pa", "harness": "mini", "max": 8}).json()
    assert {le["rollout_id"] for le in again_leases["leases"]} >= {b.rollout_id, c.rollout_id}


def test_errors_in_the_callers_terms(env: Env) -> None:
    r = post(f"{env.url}/v1/leases", {"runner_id": "r", "pool": "pa", "harness": "codex"})
    assert r.status_code == 409 and "runs harness 'mini'" in r.json()["detail"]
    r = post(f"{env.url}/v1/leases", {"runner_id": "r", "pool": "pa", "harness": "mini", "bogus": 1})
    assert r.status_code == 422
    unknown = Completion(rollout_id="g9-r000x", lease_id="x", outcome=OutcomeKind.wrong)
    r = post(f"{env.url}/v1/completions", unknown.model_dump(mode="json"))
    assert r.status_code == 404 and "unknown rollout" in r.json()["detail"]
    [le] = LeaseResponse.model_validate(post(f"{env.url}/v1/leases", {"runner_id": "r", "pool": "pa",
                                                                      "harness": "mini"}).json()).leases
    no_session = Completion(rollout_id=le.rollout_id, lease_id=le.lease_id, outcome=OutcomeKind.solved, correctness=1)
    r = post(f"{env.url}/v1/completions", no_session.model_dump(mode="json"))
    assert r.status_code == 422 and "session_id" in r.json()["detail"]


def test_metrics_endpoint_and_done(env: Env) -> None:
    env.sink.record(StepMetrics(step=3, policy_version=3, time=0, rollouts_scored=5, rollouts_unscored=1,
                                rollouts_stale=2, groups_trained=2, groups_zero_variance=1, mean_reward=0.5,
                                mean_reward_by_harness={"mini": 0.5}, loss=0.1, clip_fraction=0.05, kl=0.01,
                                tokens=10, loss_tokens=4, tokens_per_s=99.0, step_s=0.1, sync_s=0.2, grad_norm=1.0))
    text = httpx.get(f"{env.url}/metrics").text
    assert "harnessrl_learner_step 3.0" in text
    assert "harnessrl_learner_rollouts_stale 2.0" in text
    assert 'harnessrl_learner_mean_reward{harness="mini"} 0.5' in text
    assert "harnessrl_learner_kl 0.01" in text
    assert env.sink.history()[0].step == 3
    env.coord.state.done = True
    r = post(f"{env.url}/v1/leases", {"runner_id": "r", "pool": "pa", "harness": "mini"}).json()
    assert r["done"] is True and r["leases"] == []


def test_writes_need_the_runner_token_and_status_stays_open(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    lease = {"runner_id": "r", "pool": "pa", "harness": "mini"}
    done = Completion(rollout_id="g0-r0000", lease_id="x", outcome=OutcomeKind.solved, correctness=1.0)
    writes = {"/v1/leases": lease, "/v1/leases/renew": {"runner_id": "r", "lease_ids": ["x"]},
              "/v1/leases/release": {"runner_id": "r", "pool": "pa"}, "/v1/completions": done.model_dump(mode="json")}
    for path, body in writes.items():
        for token, reason in ((None, "missing runner bearer token"), ("guess", "wrong runner token"),
                              (RUNNER_TOKEN + "x", "wrong runner token")):
            r = post(f"{env.url}{path}", body, token)
            assert r.status_code == 401 and r.json() == {"detail": reason}, (path, token, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
    # Nothing was leased or completed by the refused calls; status, health and metrics need no token.
    st = httpx.get(f"{env.url}/v1/status", timeout=10).json()
    assert st["leased"] == 0 and st["rollouts_scored"] == 0
    assert httpx.get(f"{env.url}/healthz", timeout=10).status_code == 200
    assert httpx.get(f"{env.url}/metrics", timeout=10).status_code == 200
    assert post(f"{env.url}/v1/leases", lease).status_code == 200
    assert RUNNER_TOKEN not in caplog.text


class Recorder:
    """An attacker's listener on 127.0.0.1: records every byte sent to it, answers 404."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.received = b""
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(TimeoutError):
                    self.received += conn.recv(65536)
                conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        self.sock.close()


def test_a_completion_naming_a_foreign_proxy_is_refused_and_gets_no_admin_token(env: Env) -> None:
    attacker = Recorder()
    try:
        [le] = LeaseResponse.model_validate(post(f"{env.url}/v1/leases", {"runner_id": "r", "pool": "pa",
                                                                          "harness": "mini"}).json()).leases
        sid = env.session(le.rollout_id)
        forged = Completion(rollout_id=le.rollout_id, lease_id=le.lease_id, session_id=sid, outcome=OutcomeKind.solved,
                            correctness=1.0, session_base_url=attacker.url)
        ack = post(f"{env.url}/v1/completions", forged.model_dump(mode="json")).json()
    finally:
        attacker.stop()
    assert attacker.received == b""  # no request at all, so no admin token
    assert ack["status"] == "accepted" and ack["scored"] is False and ack["reward"] is None
    [entry] = list(env.journal.entries_after(0))
    assert entry.completion.outcome == OutcomeKind.infra_error and entry.sequences == []
    assert entry.completion.error is not None and "not one of this run's proxy replicas" in entry.completion.error
    assert attacker.url in entry.completion.error
