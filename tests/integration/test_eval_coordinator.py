"""The eval coordinator over HTTP.

1. As a process (`python -m harnessrl.runtime.evaluation.coordinator`), served by unmodified `harnessrl runner`
   processes running a custom harness through the real proxy in front of the scripted engine (a vLLM stand-in
   speaking its wire shape: it lets the test choose which pool's answers are right). The runners exit when the
   coordinator says done; the results hold every (pool × task × attempt) and pass@1 per pool.
2. In a thread with a controlled clock, driven with the protocol's own models: expiry and re-lease,
   idempotent completions, and the errors runners get.
3. As a process killed in the middle of a journal write (tests/fixtures/crash.py) and started again.
"""

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
import yaml
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
    OutcomeKind,
    PoolHarness,
)
from harnessrl.runtime.evaluation.config import EvalConfig
from harnessrl.runtime.evaluation.coordinator import EvalCoordinator, EvalResults, EvalStatus, create_app

from tests.fakes.scripted_engine import ScriptedReply
from tests.fixtures.crash import DROPPED, tear_env
from tests.fixtures.proxy_server import serve_in_thread
from tests.fixtures.runner_token import RUNNER_AUTH, RUNNER_TOKEN, runner_token_file
from tests.ports import free_port, wait_serving
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "examples" / "quickstart" / "tasks"
TEST_TASKS = ["vowel-08", "vowel-09", "vowel-10", "vowel-11"]
# One chat completion with the official wire format (stdlib only); the pool's MARK tells the scripted engine
# which answer to give, so each pool's pass@1 is known in advance.
AGENT = """import json, os, sys, urllib.request as u
content = os.environ["MARK"] + " " + sys.argv[1]
body = json.dumps({"model": sys.argv[2], "max_tokens": 4, "messages": [{"role": "user", "content": content}]})
req = u.Request(os.environ["HARNESSRL_BASE_URL"] + "/chat/completions", body.encode(),
                {"Authorization": "Bearer " + os.environ["HARNESSRL_API_KEY"], "Content-Type": "application/json"})
open("answer.txt", "w").write(json.load(u.urlopen(req, timeout=60))["choices"][0]["message"]["content"])
"""
HARNESS = str(Path(sys.executable).parent / "harnessrl")


def runner_config(tmp_path: Path, pool: str, mark: str, tasks: Path, coordinator: str) -> Path:
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    config = {
        "pool": pool,
        "runner_id": f"{pool}-0",
        "harness": {"kind": "custom", "name": "oneshot", "dialect": "openai_chat", "command": f"{sys.executable} {agent} {{instruction}} {{model}}",
                    "env": {"MARK": mark}},
        "sandbox": {"kind": "local", "base_dir": str(tmp_path / "sandboxes"), "read_only_paths": [str(agent)]},
        "tasks": {"kind": "dir", "path": str(tasks)},
        # All 8 rollouts of a pool at once: the broken pool's runner backs off leasing after infra errors (up to
        # 15 s, Runner.note_outcome), so it should do that once between its two tries, not once per batch.
        "concurrency": 8,
        "coordinator_url": coordinator,
        "runner_token_file": str(runner_token_file(tmp_path)),
        "timeouts": {"harness_s": 60, "grader_s": 30},
    }
    path = tmp_path / f"runner-{pool}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_unmodified_runners_serve_an_evaluation_to_done(cli_backend: tuple[Any, Any], tmp_path: Path) -> None:
    engine, proxy = cli_backend
    engine.set_script([ScriptedReply(content="apple", when_contains="MARK-GOOD"),
                       ScriptedReply(content="banana", when_contains="MARK-BAD")])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = EvalConfig(
        label="base",
        # `broken` runs with the train split only: every lease names a task it lacks, an infrastructure error.
        pools=[PoolHarness(pool=p, harness="oneshot") for p in ("good", "bad", "broken")],
        task_ids=TEST_TASKS, attempts=2, model="tiny", proxy_url=proxy.url, max_unscored=2,
        journal=tmp_path / "eval" / "journal.jsonl", runner_token_file=runner_token_file(tmp_path), results=tmp_path / "eval" / "results.json", port=port,
    )
    config_path = tmp_path / "eval.json"
    config_path.write_text(config.model_dump_json())
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def spawn(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = tmp_path / f"{name}.log"
        logs.append(log)
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    def all_logs() -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs)

    try:
        coordinator = spawn("coordinator", [sys.executable, "-m", "harnessrl.runtime.evaluation.coordinator",
                                            "--config", str(config_path)])

        def healthy() -> bool:
            assert coordinator.poll() is None, all_logs()
            try:
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 30, "the eval coordinator")
        runners = [
            spawn(f"runner-{pool}", [HARNESS, "runner", "--config",
                                     str(runner_config(tmp_path, pool, mark, tasks, url))])
            for pool, mark, tasks in (("good", "MARK-GOOD", TASKS / "test"), ("bad", "MARK-BAD", TASKS / "test"),
                                      ("broken", "MARK-GOOD", TASKS / "train"))
        ]
        # Runners exit by themselves once the coordinator says everything is completed.
        wait_until(lambda: all(r.poll() is not None for r in runners), 60, "the runners to finish", all_logs)
        assert [r.returncode for r in runners] == [0, 0, 0], all_logs()
        status = EvalStatus.model_validate(httpx.get(f"{url}/v1/status", timeout=5).json())
        assert status.done and status.rollouts == 24 and status.leased == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    results = EvalResults.model_validate_json(config.results.read_text())
    scores = {p.pool: p for p in results.pools}
    assert (scores["good"].scored, scores["good"].solved, scores["good"].pass_at_1) == (8, 8, 1.0), all_logs()
    assert (scores["bad"].scored, scores["bad"].solved, scores["bad"].pass_at_1) == (8, 0, 0.0)
    broken = scores["broken"]
    assert (broken.scored, broken.unscored, broken.pass_at_1) == (0, 8, None)
    # Each broken rollout was handed out again after its first infrastructure failure, then given up.
    assert all(s.leases == 2 and s.outcome == OutcomeKind.infra_error for s in results.slots if s.pool == "broken")
    assert {(s.task_id, s.attempt) for s in results.slots if s.pool == "good"} == {
        (t, a) for t in TEST_TASKS for a in (0, 1)}
    # Each scored rollout was a real session at the proxy: one captured model call each.
    session_ids = [json.loads(line)["completion"]["session_id"] for line in config.journal.read_text().splitlines()]
    assert len([s for s in session_ids if s]) >= 16
    # No log line carries a bearer value: neither a session id (the harness's API key, in the URL of every session
    # call a runner makes) nor the runner token. The runners logged their work (at info, their default).
    for log in logs:
        text = log.read_text()
        assert RUNNER_TOKEN not in text, log.name
        leaked = [sid for sid in session_ids if sid and sid.partition(".")[0] in text]
        assert not leaked, f"{log.name} names {len(leaked)} session ids"
    assert "runner stopped after" in (tmp_path / "runner-good.log").read_text()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_http_expiry_idempotency_and_errors(tmp_path: Path) -> None:
    config = EvalConfig(label="step-1", pools=[PoolHarness(pool="p", harness="oneshot")], task_ids=["a", "b"],
                        model="tiny-eval-step-1", policy_version=7, proxy_url="http://proxy", lease_ttl_s=30,
                        journal=tmp_path / "journal.jsonl", runner_token_file=runner_token_file(tmp_path), results=tmp_path / "results.json")
    clock = Clock()
    coordinator = EvalCoordinator(config)
    server, thread, url = serve_in_thread(create_app(coordinator, clock=clock))
    try:
        with httpx.Client(base_url=url, timeout=5, headers=RUNNER_AUTH) as http:

            def lease(runner: str, n: int = 1) -> LeaseResponse:
                r = http.post("/v1/leases", json=LeaseRequest(runner_id=runner, pool="p", harness="oneshot",
                                                              max=n).model_dump(mode="json"))
                assert r.status_code == 200, r.text
                return LeaseResponse.model_validate(r.json())

            def complete(c: Completion) -> httpx.Response:
                return http.post("/v1/completions", json=c.model_dump(mode="json"))

            first = lease("r0", 1).leases[0]
            assert (first.model, first.policy_version, first.proxy_url) == ("tiny-eval-step-1", 7, "http://proxy")
            second = lease("r0", 5).leases
            assert len(second) == 1 and second[0].rollout_id != first.rollout_id
            empty = lease("r1")
            assert empty.leases == [] and not empty.done and empty.retry_after_s > 0 and empty.renew_every_s == 10
            # r0 renews its leases while it works: they outlive the TTL.
            clock.now += 20
            renewal = LeaseRenewal(runner_id="r0", lease_ids=[first.lease_id, second[0].lease_id, "p/zzz/a0.l1-x"])
            renewed = LeaseRenewalResponse.model_validate(
                http.post("/v1/leases/renew", json=renewal.model_dump(mode="json")).json())
            assert renewed.renewed == [first.lease_id, second[0].lease_id]
            clock.now += 20
            assert lease("r1").leases == []
            # r0 is restarted: the new process hands back what the old one held, and r1 gets it at once.
            released = http.post("/v1/leases/release", json=LeaseRelease(runner_id="r0", pool="p").model_dump())
            assert LeaseReleaseResponse.model_validate(released.json()).released == 2
            again = lease("r1", 5).leases
            assert {x.rollout_id for x in again} == {first.rollout_id, second[0].rollout_id}
            relet = next(x for x in again if x.rollout_id == first.rollout_id)
            assert relet.lease_id != first.lease_id
            ok = Completion(rollout_id=relet.rollout_id, lease_id=relet.lease_id, outcome=OutcomeKind.solved,
                            correctness=1.0)
            acks = [CompletionAck.model_validate(complete(ok).json()) for _ in range(2)]
            assert [a.status for a in acks] == [AckStatus.accepted, AckStatus.duplicate]
            late = Completion(rollout_id=first.rollout_id, lease_id=first.lease_id, outcome=OutcomeKind.wrong)
            assert CompletionAck.model_validate(complete(late).json()).status == AckStatus.duplicate
            other = next(x for x in again if x.rollout_id != first.rollout_id)
            complete(Completion(rollout_id=other.rollout_id, lease_id=other.lease_id, outcome=OutcomeKind.wrong))
            assert lease("r1").done
            results = EvalResults.model_validate(http.get("/v1/results").json())
            assert results.done and results.pools[0].pass_at_1 == 0.5 and results.leases_expired == 2
            assert results.duplicates == 2
            assert json.loads(config.results.read_text())["pools"][0]["pass_at_1"] == 0.5
            # Errors a runner can get.
            unknown = Completion(rollout_id="p/zzz/a0", lease_id="x", outcome=OutcomeKind.solved)
            assert complete(unknown).status_code == 404
            wrong = http.post("/v1/leases", json={"runner_id": "r", "pool": "p", "harness": "codex", "max": 1})
            # Done wins over a wrong harness: a finished evaluation tells every runner to stop.
            assert wrong.status_code == 200 and wrong.json()["done"]
            typo = http.post("/v1/completions", json={**ok.model_dump(mode="json"), "outcom": "solved"})
            assert typo.status_code == 422
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        coordinator.close()


@pytest.mark.parametrize(("pool", "harness", "message"), [("q", "oneshot", "pool 'q' is not evaluated"),
                                                          ("p", "codex", "runs harness 'oneshot'")])
def test_http_refuses_a_runner_of_another_pool_or_harness(tmp_path: Path, pool: str, harness: str, message: str) -> None:
    config = EvalConfig(label="base", pools=[PoolHarness(pool="p", harness="oneshot")], task_ids=["a"], model="m",
                        proxy_url="http://proxy", journal=tmp_path / "j.jsonl", runner_token_file=runner_token_file(tmp_path), results=tmp_path / "r.json")
    coordinator = EvalCoordinator(config)
    server, thread, url = serve_in_thread(create_app(coordinator))
    try:
        r = httpx.post(f"{url}/v1/leases", json={"runner_id": "r", "pool": pool, "harness": harness}, timeout=5,
                       headers=RUNNER_AUTH)
        assert r.status_code == 409 and message in r.json()["detail"]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        coordinator.close()


def test_killed_in_the_middle_of_a_journal_write_it_restarts_without_the_torn_record(tmp_path: Path) -> None:
    """The coordinator process dies (SIGKILL) halfway through journaling a completion. Started again, it drops
    the torn record with a warning naming the file and byte offset, keeps every completion acked before, and the
    evaluation goes on: the runner's retry of the torn completion is accepted once, the rest are leased and
    completed, and the results count each rollout exactly once."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    journal = tmp_path / "eval" / "journal.jsonl"
    config = EvalConfig(label="base", pools=[PoolHarness(pool="p", harness="oneshot")], task_ids=["t0", "t1", "t2", "t3"],
                        model="m", proxy_url="http://proxy", lease_ttl_s=600, journal=journal,
                        runner_token_file=runner_token_file(tmp_path), results=tmp_path / "eval" / "results.json", port=port)
    config_path = tmp_path / "eval.json"
    config_path.write_text(config.model_dump_json())
    procs: list[subprocess.Popen[bytes]] = []

    def start(n: int, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"coordinator-{n}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "harnessrl.runtime.evaluation.coordinator", "--config",
                                     str(config_path)], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=os.environ | env)
        procs.append(proc)
        wait_serving(f"{url}/healthz", proc, 60, "eval coordinator", log.read_text)
        return proc, log

    def done(lease: Any, outcome: OutcomeKind, runner_id: str = "r0") -> dict[str, Any]:
        return Completion(rollout_id=lease.rollout_id, lease_id=lease.lease_id, runner_id=runner_id, outcome=outcome,
                          correctness=1.0 if outcome == OutcomeKind.solved else 0.0).model_dump(mode="json")

    try:
        first, _ = start(0, tear_env('"runner_id":"tearing-runner"'))
        with httpx.Client(base_url=url, timeout=10, headers=RUNNER_AUTH) as http:
            req = LeaseRequest(runner_id="r0", pool="p", harness="oneshot", max=4).model_dump()
            leases = LeaseResponse.model_validate(http.post("/v1/leases", json=req).json()).leases
            assert [x.task_id for x in leases] == ["t0", "t1", "t2", "t3"]
            for lease, outcome in zip(leases[:2], (OutcomeKind.solved, OutcomeKind.wrong), strict=True):
                assert http.post("/v1/completions", json=done(lease, outcome)).json()["status"] == "accepted"
            torn = done(leases[2], OutcomeKind.solved, runner_id="tearing-runner")
            with pytest.raises(httpx.TransportError):  # no ack: the process died while journaling it
                http.post("/v1/completions", json=torn)
        assert first.wait(timeout=30) == -signal.SIGKILL
        data = journal.read_bytes()
        whole = data[: data.rfind(b"\n") + 1]
        assert not data.endswith(b"\n") and data[len(whole):].startswith(b'{"seq":3,')
        assert [json.loads(line)["completion"]["rollout_id"] for line in whole.splitlines()] == [
            x.rollout_id for x in leases[:2]]

        _, log = start(1, {})
        with httpx.Client(base_url=url, timeout=10, headers=RUNNER_AUTH) as http:
            status = EvalStatus.model_validate(http.get("/v1/status").json())
            # Acked before the kill: both there. The leases themselves died with the process.
            assert (status.scored, status.leased, status.done) == (2, 0, False)
            # The runner, never acked, sends the torn completion again: accepted now, and only once.
            assert http.post("/v1/completions", json=torn).json()["status"] == "accepted"
            assert http.post("/v1/completions", json=torn).json()["status"] == "duplicate"
            req = LeaseRequest(runner_id="r0", pool="p", harness="oneshot", max=4).model_dump()
            (last,) = LeaseResponse.model_validate(http.post("/v1/leases", json=req).json()).leases
            assert last.rollout_id == leases[3].rollout_id
            assert http.post("/v1/completions", json=done(last, OutcomeKind.solved)).json()["status"] == "accepted"
            assert http.post("/v1/leases", json=req).json()["done"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=15)
    dropped = DROPPED.search(log.read_text())
    assert dropped is not None, log.read_text()
    assert (dropped[1], int(dropped[2]), int(dropped[3])) == (str(journal), len(whole), len(data) - len(whole))
    entries = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [e["seq"] for e in entries] == [1, 2, 3, 4]
    assert sorted(e["completion"]["rollout_id"] for e in entries) == sorted(x.rollout_id for x in leases)
    results = EvalResults.model_validate_json(config.results.read_text())
    (pool,) = results.pools
    assert (pool.rollouts, pool.scored, pool.solved, pool.pass_at_1, results.duplicates) == (4, 4, 3, 0.75, 1)
