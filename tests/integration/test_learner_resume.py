"""Crash and resume: SIGKILL the learner process after a checkpoint, restart it, and it is back at the
checkpoint's step with the coordinator state it had — every completion acked before the kill counted exactly
once (the checkpoint plus the journal), re-sent completions acked as duplicates — and training runs to the end.

Real learner process (`harnessrl learner`) with restart-mode weight sync (files only, no engine needed); the
proxy is the test's stand-in speaking the proxy's admin protocol, and a synthetic harness fabricates the
captured sequences (random tokens, engine-like logprobs) it registers with the stand-in.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from harnessrl.runtime.contracts.coordinator import Completion, LeaseRequest, LeaseResponse, OutcomeKind
from harnessrl.runtime.trajectory.models import TrainingSequence

from tests.fixtures.hub_server import HubServer
from tests.fixtures.learner_process import HARNESS, POOL, VOWEL_TASKS, ProxyStandIn, start_learner
from tests.fixtures.runner_token import RUNNER_AUTH, runner_token_file
from tests.ports import free_port

STEPS = 9
CK = 3  # checkpoint every CK steps: the kill lands after one (written while the next steps train) and its export


def config(workdir: Path, model_dir: Path, proxy: ProxyStandIn, token_file: Path, hub: HubServer) -> dict[str, Any]:
    return {
        "export": {"repo": "acme/resume", "token_env": "HARNESSRL_TEST_HUB_TOKEN", "endpoint": hub.endpoint},
        "run_name": "resume",
        "model": {"path": str(model_dir), "served_name": "tiny"},
        "adapter": {"kind": "lora", "rank": 4, "alpha": 8},
        "grpo": {"group_size": 4, "groups_per_step": 1, "max_staleness": 100, "steps": STEPS, "lr": 1e-3},
        "harnesses": [{"pool": POOL, "harness": HARNESS, "weight": 1}],
        "tasks": {"ids": sorted(VOWEL_TASKS)},
        "proxy": {"url": proxy.url, "admin_token_file": str(token_file)},
        "engine": {"urls": ["http://127.0.0.1:9"], "sync": "restart"},  # restart mode never calls the engine
        "checkpoint": {"dir": str(workdir / "ckpt"), "every": CK},
        "host": "127.0.0.1",
        "port": free_port(),
        "lease_ttl_s": 600,
        "runner_token_file": str(runner_token_file(workdir)),
    }


class SyntheticHarness:
    """Leases, fabricates a captured sequence in the stand-in, completes; remembers every completion it sent."""

    def __init__(self, proxy: ProxyStandIn, seed: int = 0):
        self.proxy = proxy
        self.rng = random.Random(seed)
        self.sent: list[tuple[Completion, dict[str, Any]]] = []

    async def run(self, coordinator: str, until: Any, timeout_s: float = 120) -> None:
        end = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=30, headers=RUNNER_AUTH) as http:
            while time.monotonic() < end and not until():
                req = LeaseRequest(runner_id="synthetic", pool=POOL, harness=HARNESS, max=4)
                try:
                    resp = await http.post(f"{coordinator}/v1/leases", json=req.model_dump())
                except httpx.TransportError:
                    return  # the learner is gone (killed by the test)
                lr = LeaseResponse.model_validate(resp.json())
                if lr.done:
                    return
                if not lr.leases:
                    await asyncio.sleep(0.05)
                    continue
                for lease in lr.leases:
                    session = (await http.post(f"{self.proxy.url}/sessions",
                                               headers={"authorization": f"Bearer {self.proxy.admin_token}"},
                                               json={"rollout_id": lease.rollout_id, "task_id": lease.task_id,
                                                     "harness": lease.harness, "group_id": lease.group_id})).json()
                    n_prompt, n_out = 12, 3
                    tokens = [self.rng.randrange(1, 700) for _ in range(n_prompt + n_out)]
                    self.proxy.add_sequence(session["session_id"], TrainingSequence(
                        session_id=session["session_id"], node_ids=[0], token_ids=tokens,
                        loss_mask=[0] * n_prompt + [1] * n_out,
                        logprobs=[0.0] * n_prompt + [-self.rng.uniform(5.5, 7.5) for _ in range(n_out)],
                        policy_versions=[lease.policy_version] * (n_prompt + n_out)))
                    solved = self.rng.random() < 0.5
                    c = Completion(rollout_id=lease.rollout_id, lease_id=lease.lease_id, runner_id="synthetic",
                                   session_id=session["session_id"], session_base_url=session["base_url"],
                                   outcome=OutcomeKind.solved if solved else OutcomeKind.wrong,
                                   correctness=1.0 if solved else 0.0, tool_calls=self.rng.randrange(0, 5))
                    try:
                        ack = (await http.post(f"{coordinator}/v1/completions", json=c.model_dump(mode="json"))).json()
                    except httpx.TransportError:
                        return
                    self.sent.append((c, ack))


def status(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/status", timeout=10).json())


def test_sigkill_after_checkpoint_resumes_exactly(tmp_path: Path, tiny_model_dir: Path, hub_server: HubServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESSRL_TEST_HUB_TOKEN", hub_server.token)  # inherited by the learner process
    proxy = ProxyStandIn("tiny", "admin-secret")
    proxy.start()
    token_file = tmp_path / "admin-token"
    token_file.write_text(proxy.admin_token)
    cfg = config(tmp_path, tiny_model_dir, proxy, token_file, hub_server)
    ckpt = tmp_path / "ckpt"
    harness = SyntheticHarness(proxy)
    learner = start_learner(tmp_path, cfg)
    try:
        # Run past a checkpoint before the last and its export, and 3 completions further, then kill -9.
        def past_checkpoint() -> bool:
            latest = ckpt / "latest"
            if not latest.exists() or latest.read_text() == f"step-{STEPS:07d}":
                return False
            if f"exported {latest.read_text()}" not in learner.log():  # the export runs after `latest` moves
                return False
            ck_seq = json.loads((ckpt / latest.read_text() / "coordinator.json").read_text())["journal_seq"]
            return sum(a["status"] == "accepted" for _, a in harness.sent) >= ck_seq + 3

        asyncio.run(harness.run(learner.url, past_checkpoint))
        assert past_checkpoint(), learner.log()[-3000:]
        before = status(learner.url)
        learner.stop(signal.SIGKILL)
        name = (ckpt / "latest").read_text()  # a later checkpoint written meanwhile is the one to resume from
        accepted = [c for c, a in harness.sent if a["status"] == "accepted"]
        scored = sum(1 for c, a in harness.sent if a["status"] == "accepted" and a["scored"])
        assert before["rollouts_scored"] == scored

        learner = start_learner(tmp_path, cfg)
        after = status(learner.url)
        ck = json.loads((ckpt / name / "coordinator.json").read_text())
        # It may already be training the next step, so the restore is read from its log and the step metrics.
        log = learner.log()
        assert f"resumed from {name} at step {ck['step']} (policy v{ck['policy_version']})" in log
        assert f"replayed {len(accepted) - ck['journal_seq']} completions" in log
        assert after["step"] >= ck["step"] and ck["step"] % CK == 0
        # Nothing acked is lost: the checkpoint's completions plus the journal's replayed ones.
        assert after["rollouts_scored"] == scored
        assert ck["counters"]["rollouts_scored"] < scored  # some really came from the journal
        # Nothing is counted twice: every completion sent again is a duplicate.
        with httpx.Client(timeout=10, headers=RUNNER_AUTH) as http:
            for c in accepted:
                ack = http.post(f"{learner.url}/v1/completions", json=c.model_dump(mode="json")).json()
                assert ack["status"] == "duplicate", ack
        assert status(learner.url)["rollouts_scored"] == scored
        # Training continues to the end; each step is recorded once.
        asyncio.run(harness.run(learner.url, lambda: False))
        learner.proc.wait(timeout=60)
        assert learner.proc.returncode == 0, learner.log()[-3000:]
        steps = [json.loads(ln)["step"] for ln in (ckpt / "metrics.jsonl").read_text().splitlines()]
        assert steps == list(range(1, STEPS + 1))
        final = json.loads((ckpt / f"step-{STEPS:07d}" / "coordinator.json").read_text())
        total = sum(1 for _, a in harness.sent if a["status"] == "accepted" and a["scored"])
        # Rollouts finished after the last step's checkpoint are in the journal only.
        late = [e for e in map(json.loads, (ckpt / "journal.jsonl").read_text().splitlines())
                if e["seq"] > final["journal_seq"]]
        assert final["counters"]["rollouts_scored"] + len(late) == total
        assert (ckpt / "sync" / "policy.json").exists()
        # Every checkpoint was exported to its own branch, and the Hub token never reached the learner's logs.
        branches = set(hub_server.state.repos["acme/resume"].branches)
        assert {f"step-{ck['step']}", f"step-{STEPS}"} <= branches
        logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("learner.*.log"))
        assert f"exported {name}" in logs and hub_server.token not in logs
    finally:
        learner.stop(signal.SIGKILL)
        proxy.stop()
