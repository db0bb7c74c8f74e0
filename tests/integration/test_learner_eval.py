"""Evaluation on the TrainingRun's schedule, in the real learner process (`harnessrl learner`, tiny model,
restart-mode weight sync: files only, no engine needed): a round of the base policy before the first step, one at
every `every_steps` and one after the last step, served over the same lease protocol to a trained pool and an eval-only pool, training paused while it runs,
its pass@1 in `GET /v1/status` and in eval.jsonl beside metrics.jsonl.

The proxy is the test's stand-in speaking the proxy's admin protocol (tests/fixtures/learner_process.py); the
runners are synthetic: they create each session at the stand-in as a runner does, fabricate a captured sequence
for training rollouts only, and grade eval rollouts by a fixed rule, so the expected pass@1 is known.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from harnessrl.runtime.contracts.coordinator import (
    Completion,
    CoordinatorStatus,
    Lease,
    LeaseRequest,
    LeaseResponse,
    OutcomeKind,
)
from harnessrl.runtime.coordinator.journal import JournalEntry
from harnessrl.runtime.learner.checkpoint import latest_checkpoint
from harnessrl.runtime.learner.evaluation import read_records
from harnessrl.runtime.trajectory.models import TrainingSequence

from tests.fixtures.crash import DROPPED, tear_env
from tests.fixtures.learner_process import HARNESS, POOL, VOWEL_TASKS, ProxyStandIn, start_learner
from tests.fixtures.runner_token import RUNNER_AUTH, runner_token_file
from tests.ports import free_port

pytestmark = pytest.mark.timeout(240)
STEPS, EVERY = 3, 2  # rounds before step 1 (the base policy), after steps 2 (every_steps) and 3 (the last)
EVAL_POOL, EVAL_HARNESS = "eval-only", "qwen-code"
HELD_OUT = ["held-0", "held-1", "held-2", "held-3"]
SOLVED = {"held-0", "held-1", "held-2"}  # pass@1 0.75 in every round, under both pools


def config(workdir: Path, model_dir: Path, proxy: ProxyStandIn, token_file: Path, at_start: bool = True,
           **changes: Any) -> dict[str, Any]:
    (workdir / "eval-ids.txt").write_text("".join(f"{t}\n" for t in reversed(HELD_OUT)))
    return {
        "model": {"path": str(model_dir), "served_name": "tiny"},
        "grpo": {"group_size": 2, "groups_per_step": 1, "steps": STEPS},
        "harnesses": [{"pool": POOL, "harness": HARNESS, "weight": 1}],
        "tasks": {"ids": sorted(VOWEL_TASKS)},
        "eval": {
            "every_steps": EVERY,
            "at_start": at_start,
            "pools": [{"pool": POOL, "harness": HARNESS}, {"pool": EVAL_POOL, "harness": EVAL_HARNESS}],
            "tasks": {"file": str(workdir / "eval-ids.txt"), "split": "test"},
        },
        "proxy": {"url": proxy.url, "admin_token_file": str(token_file)},
        "engine": {"urls": ["http://127.0.0.1:9"], "sync": "restart"},  # restart mode never calls the engine
        "checkpoint": {"dir": str(workdir / "ckpt"), "every": 10},
        "host": "127.0.0.1",
        "port": free_port(),
        "lease_ttl_s": 600,
        "runner_token_file": str(runner_token_file(workdir)),
    } | changes


async def call(http: httpx.AsyncClient, url: str, body: dict[str, Any] | None, patience_s: float = 90) -> Any:
    """POST (GET without a body), retried while the learner is down (a test may kill and restart it): nothing a
    runner did is dropped."""
    end = time.monotonic() + patience_s
    while True:
        try:
            sent = http.get(url) if body is None else http.post(url, json=body)
            return (await sent).raise_for_status().json()
        except httpx.HTTPError:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.5)


class Runner:
    """One pool's synthetic runner. Records each eval lease with the coordinator's step when it completed it, and
    each completion with its ack's status; `before_eval(n)` is called before its n-th eval completion is sent
    (and may name another runner id to send it under), `after_eval(n)` once it is acked."""

    def __init__(self, proxy: ProxyStandIn, coordinator: str, pool: str, harness: str,
                 after_eval: Callable[[int], None] = lambda n: None,
                 before_eval: Callable[[int], str | None] = lambda n: None) -> None:
        self.proxy, self.coordinator, self.pool, self.harness = proxy, coordinator, pool, harness
        self.after_eval, self.before_eval = after_eval, before_eval
        self.acked: list[tuple[Completion, str]] = []
        self.eval_leases: list[tuple[Lease, int]] = []
        self.train_leases: list[Lease] = []
        self.final_status: CoordinatorStatus | None = None

    async def run(self, timeout_s: float = 180) -> None:
        end = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=30, headers=RUNNER_AUTH) as http:
            while time.monotonic() < end:
                req = LeaseRequest(runner_id=f"{self.pool}-runner", pool=self.pool, harness=self.harness, max=4)
                got = LeaseResponse.model_validate(await call(http, f"{self.coordinator}/v1/leases", req.model_dump()))
                if got.done:  # the learner answers `done` a few seconds before it exits
                    # Its last checkpoint is written in the background and recorded at the loop's next turn.
                    for _ in range(100):
                        status = (await http.get(f"{self.coordinator}/v1/status")).json()
                        if status.get("latest_checkpoint"):
                            break
                        await asyncio.sleep(0.1)
                    self.final_status = CoordinatorStatus.model_validate(status)
                    return
                if not got.leases:
                    await asyncio.sleep(0.05)
                for lease in got.leases:
                    await self.roll(http, lease)

    async def roll(self, http: httpx.AsyncClient, lease: Lease) -> None:
        session = (await http.post(f"{self.proxy.url}/sessions", headers={"authorization": f"Bearer {self.proxy.admin_token}"},
                                   json={"rollout_id": lease.rollout_id, "task_id": lease.task_id, "harness": lease.harness,
                                         "group_id": lease.group_id, "training": lease.training})).json()
        sid = session["session_id"]
        if lease.training:
            self.train_leases.append(lease)
            n = len(self.train_leases)
            self.proxy.add_sequence(sid, TrainingSequence(
                session_id=sid, node_ids=[0], token_ids=[3, 4, 5, 6 + n % 50], loss_mask=[0, 0, 1, 1],
                logprobs=[0.0, 0.0, -6.0, -6.5], policy_versions=[lease.policy_version] * 4))
            solved = n % 2 == 0  # reward variance within each group of 2
        else:  # nothing captured for an eval session: the learner must not ask for its sequences
            solved = lease.task_id in SOLVED
            step = (await call(http, f"{self.coordinator}/v1/status", None))["step"]
            self.eval_leases.append((lease, step))
        runner_id = (not lease.training and self.before_eval(len(self.eval_leases))) or f"{self.pool}-runner"
        completion = Completion(rollout_id=lease.rollout_id, lease_id=lease.lease_id, runner_id=runner_id,
                                session_id=sid, session_base_url=session["base_url"],
                                outcome=OutcomeKind.solved if solved else OutcomeKind.wrong,
                                correctness=1.0 if solved else 0.0, tool_calls=1)
        ack = await call(http, f"{self.coordinator}/v1/completions", completion.model_dump(mode="json"))
        # After a learner restart, a rollout leased again meanwhile may already be done: a duplicate, counted once.
        assert ack["status"] in ("accepted", "duplicate"), ack
        self.acked.append((completion, ack["status"]))
        if not lease.training:
            self.after_eval(len(self.eval_leases))


async def serve_both(trained: Runner, eval_only: Runner) -> None:
    await asyncio.gather(trained.run(), eval_only.run())


def test_rounds_at_every_steps_and_after_the_last_step_land_in_status(tmp_path: Path, tiny_model_dir: Path) -> None:
    proxy = ProxyStandIn("tiny", "admin-secret")
    proxy.start()
    token_file = tmp_path / "admin-token"
    token_file.write_text(proxy.admin_token)
    learner = start_learner(tmp_path, config(tmp_path, tiny_model_dir, proxy, token_file))
    try:
        trained = Runner(proxy, learner.url, POOL, HARNESS)
        eval_only = Runner(proxy, learner.url, EVAL_POOL, EVAL_HARNESS)
        asyncio.run(serve_both(trained, eval_only))
        log = learner.log()
        assert learner.proc.wait(timeout=60) == 0, log[-3000:]
    finally:
        learner.stop()
        proxy.stop()

    # Three rounds, each: every held-out task once under each pool, for the policy of its step.
    evals = trained.eval_leases + eval_only.eval_leases
    rounds = sorted({lease.policy_version for lease, _ in evals})
    assert rounds == [0, EVERY, STEPS], log[-3000:]
    for version in rounds:
        leased = sorted((lease.pool, lease.task_id) for lease, _ in evals if lease.policy_version == version)
        assert leased == sorted((p, t) for p in (POOL, EVAL_POOL) for t in HELD_OUT)
    # Training paused while a round ran: each eval rollout completed at the step it evaluates.
    assert all(step == lease.policy_version for lease, step in evals)
    # The eval-only pool got no training rollout; the trained pool got both kinds, told apart.
    assert eval_only.train_leases == [] and len(eval_only.eval_leases) == 3 * len(HELD_OUT)
    assert trained.train_leases and all(not lease.training for lease, _ in evals)

    # The results: eval.jsonl beside metrics.jsonl, and the latest round in the coordinator's status.
    ckpt = tmp_path / "ckpt"
    records = read_records(ckpt / "eval.jsonl")
    assert [(r.step, r.policy_version) for r in records] == [(0, 0), (EVERY, EVERY), (STEPS, STEPS)]
    for r in records:
        assert r.pass_at1() == {POOL: 0.75, EVAL_POOL: 0.75}
        assert [(p.rollouts, p.scored, p.solved, p.unscored) for p in r.pools] == [(4, 4, 3, 0)] * 2
    status = trained.final_status
    assert status is not None and status.done and status.step == STEPS
    assert status.pass_at1 == {POOL: 0.75, EVAL_POOL: 0.75} and status.last_eval == records[-1]
    assert status.evaluating is None and status.mean_reward is not None
    assert status.pools[EVAL_POOL].completed == 3 * len(HELD_OUT) and status.pools[EVAL_POOL].active == 0
    assert status.latest_checkpoint is not None and status.latest_checkpoint.endswith("step-0000003")
    # Eval completions are journaled (a restart replays them) without sequences, and never trained on.
    entries = [JournalEntry.model_validate_json(ln) for ln in (ckpt / "journal.jsonl").read_text().splitlines()]
    journaled_evals = [e for e in entries if e.completion.rollout_id.startswith("eval-")]
    assert len(journaled_evals) == len(evals) and all(e.sequences == [] for e in journaled_evals)
    assert {e.harness for e in journaled_evals} == {HARNESS, EVAL_HARNESS}
    assert all(f"eval at step {s} (policy v{s}): pass@1" in log for s in (0, EVERY, STEPS))


def test_a_learner_killed_mid_round_resumes_it_and_counts_each_rollout_once(tmp_path: Path, tiny_model_dir: Path) -> None:
    proxy = ProxyStandIn("tiny", "admin-secret")
    proxy.start()
    token_file = tmp_path / "admin-token"
    token_file.write_text(proxy.admin_token)
    # A checkpoint after every step: the one after step 2 holds the round it opened. Short leases: a lease the
    # kill orphaned goes out again soon (real runners renew theirs, these synthetic ones finish in well under 5 s).
    # No base round: the kill is staged in the round after step 2, counted from the first eval completion.
    cfg = config(tmp_path, tiny_model_dir, proxy, token_file, False, checkpoint={"dir": str(tmp_path / "ckpt"), "every": 1},
                 lease_ttl_s=5)
    learners = [start_learner(tmp_path, cfg)]

    def kill_and_restart(n: int) -> None:
        if n == 3:  # three eval rollouts of the first round are done, five are not
            # The round's leases go out while the checkpoint after step 2 is still being written (in a thread): kill
            # only once it is on disk, or the restart resumes from step 1 (the runners wait here meanwhile).
            deadline = time.monotonic() + 60
            while (latest := latest_checkpoint(tmp_path / "ckpt")) is None or latest.name < "step-0000002":
                assert time.monotonic() < deadline, "no checkpoint after step 2 within 60 s"
                time.sleep(0.05)
            learners[0].stop(signal.SIGKILL)
            learners.append(start_learner(tmp_path, cfg))

    try:
        trained = Runner(proxy, learners[0].url, POOL, HARNESS, after_eval=kill_and_restart)
        eval_only = Runner(proxy, learners[0].url, EVAL_POOL, EVAL_HARNESS)
        asyncio.run(serve_both(trained, eval_only))
        assert len(learners) == 2 and learners[1].proc.wait(timeout=60) == 0, learners[-1].log()[-3000:]
    finally:
        for learner in learners:
            learner.stop()
        proxy.stop()
    resumed = learners[1].log()
    assert "resumed from step-0000002" in resumed, resumed[-3000:]
    ckpt = tmp_path / "ckpt"
    assert [m["step"] for m in map(json.loads, (ckpt / "metrics.jsonl").read_text().splitlines())] == [1, 2, 3]
    # Both rounds finished, each counting every held-out task under each pool exactly once.
    records = read_records(ckpt / "eval.jsonl")
    assert [(r.step, r.policy_version) for r in records] == [(EVERY, EVERY), (STEPS, STEPS)]
    for r in records:
        assert [(p.rollouts, p.scored, p.solved, p.unscored) for p in r.pools] == [(4, 4, 3, 0)] * 2
        assert r.pass_at1() == {POOL: 0.75, EVAL_POOL: 0.75}


def wait_for_checkpoint(ckpt: Path, name: str) -> None:
    deadline = time.monotonic() + 60
    while (latest := latest_checkpoint(ckpt)) is None or latest.name < name:
        assert time.monotonic() < deadline, f"no checkpoint {name} within 60 s"
        time.sleep(0.05)


@pytest.mark.timeout(480)  # two learner starts (torch, the model) on a shared machine
def test_a_learner_killed_in_the_middle_of_a_journal_write_resumes_without_the_torn_record(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    """Kill during a write: the learner dies (SIGKILL) halfway through journaling an eval completion of the round
    opened after step 2 (tests/fixtures/crash.py). Started again, it drops the torn record with a warning naming
    the file and byte offset, resumes from the step-2 checkpoint with that round still open and every completion
    acked since replayed, and runs to the end: each accepted completion (training and evaluation) journaled
    exactly once, the torn one once (the runner's retry), and both rounds count every rollout once."""
    proxy = ProxyStandIn("tiny", "admin-secret")
    proxy.start()
    token_file = tmp_path / "admin-token"
    token_file.write_text(proxy.admin_token)
    ckpt = tmp_path / "ckpt"
    journal = ckpt / "journal.jsonl"
    # No base round: the tear is staged in the round after step 2, counted from the first eval completion.
    cfg = config(tmp_path, tiny_model_dir, proxy, token_file, False, checkpoint={"dir": str(ckpt), "every": 1},
                 lease_ttl_s=5)
    tear = "tearing-runner"
    learners = [start_learner(tmp_path, cfg, timeout_s=240, env=tear_env(f'"runner_id":"{tear}"'))]
    torn: list[bytes] = []

    def before_eval(n: int) -> str | None:
        if n == 3:  # the round is in the step-2 checkpoint: go on once it is on disk, so this completion and
            wait_for_checkpoint(ckpt, "step-0000002")  # the torn one come after it (replayed, and torn)
        return tear if n == 4 else None

    async def restart_once_killed() -> None:
        while learners[0].proc.poll() is None:
            await asyncio.sleep(0.05)
        torn.append(journal.read_bytes())
        # Started on the loop, which waits meanwhile: the runners' retries resume once it serves, however long the
        # start takes on a loaded machine.
        learners.append(start_learner(tmp_path, cfg, 240))

    trained = Runner(proxy, learners[0].url, POOL, HARNESS, before_eval=before_eval)
    eval_only = Runner(proxy, learners[0].url, EVAL_POOL, EVAL_HARNESS)

    async def scenario() -> None:
        restart = asyncio.create_task(restart_once_killed())
        try:
            await serve_both(trained, eval_only)
            assert restart.done(), "the learner never died"
            await restart
        finally:
            restart.cancel()

    try:
        asyncio.run(scenario())
        assert len(learners) == 2 and learners[1].proc.wait(timeout=60) == 0, learners[-1].log()[-3000:]
    finally:
        for learner in learners:
            learner.stop()
        proxy.stop()
    assert learners[0].proc.returncode == -signal.SIGKILL, learners[0].log()[-3000:]
    resumed = learners[1].log()
    assert "resumed from step-0000002" in resumed, resumed[-3000:]
    # What the kill left: whole records, then the first part of the next one.
    (data,) = torn
    whole = data[: data.rfind(b"\n") + 1]
    last_seq = json.loads(whole.splitlines()[-1])["seq"]
    assert not data.endswith(b"\n") and data[len(whole):].startswith(b'{"seq":%d,' % (last_seq + 1))
    # Replayed on top of the checkpoint: everything journaled after it up to the torn record.
    ckpt_seq = json.loads((ckpt / "step-0000002" / "coordinator.json").read_text())["journal_seq"]
    assert last_seq > ckpt_seq and f"replayed {last_seq - ckpt_seq} completions from {journal}" in resumed
    dropped = DROPPED.search(resumed)
    assert dropped is not None, resumed[-3000:]
    assert (dropped[1], int(dropped[2]), int(dropped[3])) == (str(journal), len(whole), len(data) - len(whole))

    # Every completion acked as accepted is journaled exactly once; the torn one too (its retry), once.
    entries = [JournalEntry.model_validate_json(ln) for ln in journal.read_text().splitlines()]
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    journaled = [(e.completion.rollout_id, e.completion.lease_id) for e in entries]
    assert len(journaled) == len(set(journaled))
    acked = trained.acked + eval_only.acked
    accepted = {(c.rollout_id, c.lease_id) for c, status in acked if status == "accepted"}
    assert accepted <= set(journaled)
    # ... and nothing else was journaled (an ack the kill cut off comes back as a duplicate on the retry).
    assert set(journaled) <= {(c.rollout_id, c.lease_id) for c, _ in acked}
    assert [e.completion.runner_id for e in entries].count(tear) == 1
    # The round open at the kill resumed (one round per step, same rollout ids before and after) and finished.
    prefixes = {(lease.policy_version, lease.rollout_id.split("/")[0]) for lease, _ in trained.eval_leases + eval_only.eval_leases}
    assert sorted(v for v, _ in prefixes) == [EVERY, STEPS]
    records = read_records(ckpt / "eval.jsonl")
    assert [(r.step, r.policy_version) for r in records] == [(EVERY, EVERY), (STEPS, STEPS)]
    for r in records:
        assert [(p.rollouts, p.scored, p.solved, p.unscored) for p in r.pools] == [(4, 4, 3, 0)] * 2
    assert [m["step"] for m in map(json.loads, (ckpt / "metrics.jsonl").read_text().splitlines())] == [1, 2, 3]
