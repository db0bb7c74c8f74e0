"""`harnessrl runner --config FILE` as a process: it leases from the learner's real coordinator, runs a custom
harness declared only in its config (a small agent on the official `openai` SDK) through the real proxy in front of
the scripted engine, completes the rollouts, renews the leases of rollouts still running, and on SIGTERM cancels
what is in flight and leaves nothing behind; a runner started again under the same id hands back its predecessor's
leases at once, and the leases of a runner that is gone, no longer renewed, expire and are handed out again."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from harnessrl.runtime.contracts.coordinator import LeaseRequest, LeaseResponse
from harnessrl.runtime.harness.sandboxes.local import tagged_pids

from tests.fakes.scripted_engine import ScriptedReply
from tests.fixtures.runner_token import RUNNER_AUTH, runner_token_file
from tests.waiting import wait_until

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"
ANSWER = json.loads((TASKS / "train" / "sales-total" / "tests" / "expected.json").read_text())["value"]
AGENT = """import sys
from openai import OpenAI

base_url, api_key, model, instruction = sys.argv[1:5]
reply = OpenAI(base_url=base_url, api_key=api_key, max_retries=0).chat.completions.create(
    model=model, messages=[{"role": "user", "content": instruction}])
open("answer.txt", "w").write(reply.choices[0].message.content.strip() + "\\n")
"""


def lease_as_another_runner(coordinator_url: str) -> set[str]:
    """The rollout ids another runner is handed now (expired leases become pending again on a lease call)."""
    request = LeaseRequest(runner_id="runner-1", pool="custom-pool", harness="my-agent", max=64)
    resp = httpx.post(f"{coordinator_url}/v1/leases", json=request.model_dump(mode="json"), timeout=10,
                      headers=RUNNER_AUTH)
    resp.raise_for_status()
    return {lease.rollout_id for lease in LeaseResponse.model_validate(resp.json()).leases}


def start_runner(config_path: Path, log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen([str(Path(sys.executable).parent / "harnessrl"), "runner", "--config", str(config_path)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def held_by(coordinator: Any, runner_id: str) -> dict[str, str]:
    return {s.rollout_id: s.lease_id for g in coordinator.state.groups for s in g.slots
            if s.status == "leased" and s.runner_id == runner_id}


def test_runner_process_serves_the_pool_and_stops_on_sigterm(rollout_stack: Any, tmp_path: Path) -> None:
    ttl = 3.0  # renewed every second by the runner
    stack = rollout_stack([("custom-pool", "my-agent")], "sales-total", group_size=2, lease_ttl_s=ttl)
    # Every call answers with the right number; a second group's calls are delayed so SIGTERM finds them in flight.
    stack.engine.set_script([ScriptedReply(content=str(ANSWER), max_uses=2), ScriptedReply(content="0", delay_s=120)])
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    config = {
        "pool": "custom-pool",
        "runner_id": "runner-0",
        "harness": {"kind": "custom", "name": "my-agent", "dialect": "openai_chat",
                    "command": f"{sys.executable} {agent} {{base_url}} {{api_key}} {{model}} {{instruction}}"},
        "sandbox": {"kind": "local", "base_dir": str(tmp_path / "sandboxes"), "read_only_paths": [str(agent)]},
        "tasks": {"kind": "dir", "path": str(TASKS)},
        "concurrency": 2,
        "coordinator_url": stack.coordinator_url,
        "runner_token_file": str(runner_token_file(tmp_path)),
        "timeouts": {"harness_s": 300},
    }
    config_path = tmp_path / "runner.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = tmp_path / "runner.log"
    proc = start_runner(config_path, log_path)
    try:
        wait_until(lambda: stack.coordinator.status().rollouts_scored >= 2 or proc.poll() is not None, 120,
                   "two scored rollouts")
        assert proc.poll() is None, log_path.read_text()
        status = stack.coordinator.status()
        assert status.rollouts_scored == 2 and status.rollouts_unscored == 0
        # The next group is leased and its harnesses are waiting on the (delayed) model when SIGTERM comes.
        wait_until(lambda: len(tagged_pids("custom-pool-runner-0-")) > 0, 60, "the next group's harnesses")
        # A rollout running longer than the lease TTL keeps its lease: the runner renews it.
        wait_until(lambda: len(held_by(stack.coordinator, "runner-0")) == 2, 30, "both rollouts leased")
        running = held_by(stack.coordinator, "runner-0")
        time.sleep(3 * ttl)
        assert not lease_as_another_runner(stack.coordinator_url) & running.keys()
        assert held_by(stack.coordinator, "runner-0") == running
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text()
        # Its successor (same runner id and pool) hands back at once what it held, and takes it on again.
        restarted_log = tmp_path / "runner-restarted.log"
        proc = start_runner(config_path, restarted_log)
        wait_until(lambda: held_by(stack.coordinator, "runner-0").keys() == running.keys()
                   and held_by(stack.coordinator, "runner-0") != running, 30, "the rollouts leased again")
        assert "released 2 lease(s) an earlier process of runner runner-0 held" in restarted_log.read_text()
        running = held_by(stack.coordinator, "runner-0")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, restarted_log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = log_path.read_text()
    assert log.count(": solved correctness=1.00") == 2, log
    assert tagged_pids("custom-pool-runner-0-") == []
    assert list((tmp_path / "sandboxes").iterdir()) == []
    # Cancelled rollouts were not completed: their leases expire and are handed out again.
    assert stack.coordinator.status().rollouts_scored == 2 and stack.coordinator.status().rollouts_unscored == 0
    time.sleep(ttl + 0.5)
    assert running.keys() <= lease_as_another_runner(stack.coordinator_url)
