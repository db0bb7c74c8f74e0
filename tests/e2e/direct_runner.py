"""The transfer experiment's training setups as `harnessrl run` plans them, and a direct runner for its CI-sized
check (tests/e2e/test_transfer.py).

The direct runner stands in for `harnessrl runner` so that check can afford enough steps on 2 cores. It leases
from the coordinator, opens a session at the real proxy, runs the pool's harness program, grades the answer and
completes. The program is the pool's own (the `python3 -c "$HARNESS" …` command the real Custom adapter renders
from examples/transfer/harnesses.yaml: same source, arguments and environment), executed in a pre-started
interpreter of a forkserver pool instead of a fresh `python3` in the runner's sandbox: a fresh interpreter costs
~120 ms of CPU (urllib's imports) and the task's verifier (bash, then python3) ~100 ms, which at ~60 rollouts a
step of two runs made each step take 15-30 s here; the sandbox adds ~2.5 s of wall time per rollout (bubblewrap
and its network relay; measured under `harnessrl run`). The answer is graded by the verifier's rule (the first
letter of answer.txt is a vowel), tests/fixtures/learning.py's VOWEL. The runner and sandbox have their own tests.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import shlex
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from harnessrl.operator.plan import build_plan
from harnessrl.operator.plan.placement import ClusterPlacement
from harnessrl.runtime.contracts.coordinator import (
    Completion,
    Lease,
    LeaseRequest,
    OutcomeKind,
    Timings,
)
from harnessrl.runtime.contracts.learner_config import LearnerConfig
from harnessrl.runtime.contracts.proxy import CreateSessionRequest, ProxyClient
from harnessrl.runtime.contracts.runner_config import CustomHarnessSpec
from harnessrl.runtime.harness.adapters.base import RunContext
from harnessrl.runtime.harness.adapters.custom import Custom
from harnessrl.runtime.harness.tasks import Task, load_dir, split_tasks

from harnessrl.local.run import read_inputs
from tests.e2e import program_worker
from tests.fixtures.learning import VOWEL, lease_loop
from tests.fixtures.transfer import EXPERIMENT

TRANSFER = EXPERIMENT.parent
TASKS_DIR = TRANSFER.parent / "quickstart" / "tasks"
PROGRAM = ["python3", "-c", "$HARNESS"]  # how every pool of harnesses.yaml runs its program


@dataclass(frozen=True)
class Setup:
    """One training setup as planned from its YAML: the learner's config (placement fields still to be set) and
    each pool's harness."""

    learner: LearnerConfig
    harnesses: dict[str, Custom]  # by pool


def plan_setup(run_file: Path) -> Setup:
    """What `harnessrl run examples/transfer/harnesses.yaml RUN_FILE` would run."""
    run, pools = read_inputs([TRANSFER / "harnesses.yaml", run_file])
    plan = build_plan(run.metadata.name, "local", run.spec, {n: p.spec for n, p in pools.items()},
                      ClusterPlacement("local"))
    assert isinstance(plan.learner.config, LearnerConfig)
    harnesses = {}
    for runner in plan.runners:
        spec = getattr(runner.config, "harness", None)
        assert isinstance(spec, CustomHarnessSpec) and runner.pool is not None
        harnesses[runner.pool] = Custom(spec)
    return Setup(plan.learner.config, harnesses)


def split(name: str) -> dict[str, Task]:
    return split_tasks(load_dir(TASKS_DIR), "test" if name == "test" else "train")


@contextmanager
def program_pool(workers: int = 24) -> Iterator[ProcessPoolExecutor]:
    """Interpreters that run harness programs, with what the programs import already imported."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["json", "urllib.request", program_worker.__name__])
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        yield pool


async def run_and_grade(pool: ProcessPoolExecutor, harness: Custom, task: Task, model: str, base_url: str,
                        api_key: str) -> float:
    """Run the harness on `task` in a fresh workspace, then grade its answer.txt."""
    with tempfile.TemporaryDirectory(prefix="transfer-rollout-") as tmp:
        workspace, home = Path(tmp) / "workspace", Path(tmp) / "home"
        workspace.mkdir()
        home.mkdir()
        ctx = RunContext(instruction=task.instruction, model=model, base_url=base_url, api_key=api_key,
                         step_budget=50, home=str(home), workspace=str(workspace))
        invocation = harness.invocation(ctx)
        words = shlex.split(invocation.argv[-1])  # sh -c '<the rendered command>'
        assert invocation.argv[:2] == ["sh", "-c"] and words[:3] == PROGRAM, invocation.argv
        env = invocation.env | {"HOME": str(home)}
        await asyncio.wrap_future(pool.submit(program_worker.execute, env["HARNESS"], ["-c", *words[3:]], env, str(workspace)))
        answer = workspace / "answer.txt"
        return 1.0 if answer.exists() and VOWEL.solved(answer.read_text(errors="replace")) else 0.0


async def sampled(http: httpx.AsyncClient, pool: ProcessPoolExecutor, admin_token: str, proxy_url: str,
                  request: CreateSessionRequest, harness: Custom, task: Task, model: str) -> tuple[str, str, float]:
    """One rollout through a new proxy session: (session id, its replica's URL, reward)."""
    s = await ProxyClient(http, admin_token).create_session(proxy_url, request)
    reward = await run_and_grade(pool, harness, task, model, s.dialect_base_urls.openai, s.session_id)
    return s.session_id, s.base_url, reward


async def _rollout(http: httpx.AsyncClient, pool: ProcessPoolExecutor, admin_token: str, lease: Lease,
                   harness: Custom, task: Task) -> Completion:
    started = time.time()
    request = CreateSessionRequest(rollout_id=lease.rollout_id, task_id=lease.task_id, harness=lease.harness,
                                   group_id=lease.group_id)
    sid, base_url, reward = await sampled(http, pool, admin_token, lease.proxy_url, request, harness, task,
                                          lease.model)
    return Completion(rollout_id=lease.rollout_id, lease_id=lease.lease_id, runner_id="direct", session_id=sid,
                      session_base_url=base_url, outcome=OutcomeKind.solved if reward >= 1.0 else OutcomeKind.wrong,
                      correctness=reward, tool_calls=0, timings=Timings(started_at=started, finished_at=time.time()))


async def direct_runner(coordinator: str, runner_auth: dict[str, str], admin_token: str, pool: ProcessPoolExecutor,
                        harnesses: dict[str, Custom], deadline_s: float, concurrency: int = 8) -> None:
    """Lease, roll out and complete in every pool of `harnesses` until the coordinator says training is done."""
    train = split("train")
    deadline = time.monotonic() + deadline_s

    async def serve(name: str, harness: Custom) -> None:
        request = LeaseRequest(runner_id="direct", pool=name, harness=harness.spec.name, max=concurrency)
        async with httpx.AsyncClient(timeout=60, headers=runner_auth) as http:
            await lease_loop(http, coordinator, request, deadline,
                             lambda lease: _rollout(http, pool, admin_token, lease, harness, train[lease.task_id]))

    await asyncio.gather(*(serve(name, harness) for name, harness in harnesses.items()))
