"""What the candidate breaks counts against it, with the real local sandbox and graders (the proxy is the unit
tests' in-memory stand-in: only its session answers matter here). An endless loop, a FIFO or /dev/zero for an
answer, and a verifier that hangs on the candidate's input each end scored 0; a grader that fails on the task's
reference answer too is unscored."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest
from harnessrl.runtime.contracts.coordinator import SCORED_OUTCOMES, Lease, OutcomeKind
from harnessrl.runtime.contracts.runner_config import RunnerConfig
from harnessrl.runtime.harness.adapters import adapter_for
from harnessrl.runtime.harness.runner import Runner
from harnessrl.runtime.harness.sandboxes.local import LocalProvider
from harnessrl.runtime.harness.tasks import load_dir

from tests.unit.test_runner_outcomes import proxy_transport

GCD = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "test" / "gcd"
# A verifier written without care for what it reads (as many are): `cat` blocks on a FIFO and never ends on
# /dev/zero. Its reference answer passes.
NAIVE_TEST = """#!/usr/bin/env bash
cd "$WORKSPACE"; mkdir -p "$LOGS_DIR/verifier"
if [ "$(cat answer.txt)" = 42 ]; then echo 1; else echo 0; fi > "$LOGS_DIR/verifier/reward.txt"
"""
BROKEN_TEST = "#!/usr/bin/env bash\nexit 0\n"  # writes no reward, whatever the answer

if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)", allow_module_level=True)


def task_dir(root: Path, name: str, test_sh: str) -> None:
    (root / name / "tests").mkdir(parents=True)
    (root / name / "solution").mkdir()
    (root / name / "environment").mkdir()
    (root / name / "instruction.md").write_text("Write 42 to answer.txt.\n")
    (root / name / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 5.0\n')
    (root / name / "tests" / "test.sh").write_text(test_sh)
    (root / name / "solution" / "solve.sh").write_text('echo 42 > "$WORKSPACE/answer.txt"\n')


@pytest.mark.parametrize(
    ("task", "attack", "outcome"),
    [
        ("gcd", "printf 'def gcd(a, b):\\n    while True: pass\\n' > solution.py", OutcomeKind.wrong),
        ("naive", "mkfifo answer.txt", OutcomeKind.grader_timeout),
        ("naive", "ln -s /dev/zero answer.txt", OutcomeKind.grader_timeout),  # bash drops the NULs: no end
        ("naive", "echo 41 > answer.txt", OutcomeKind.wrong),
        ("broken", "echo 42 > answer.txt", OutcomeKind.grader_error),
    ],
)
async def test_what_the_candidate_breaks_scores_zero(tmp_path: Path, task: str, attack: str,
                                                     outcome: OutcomeKind) -> None:
    tasks = tmp_path / "tasks"
    shutil.copytree(GCD, tasks / "gcd")
    task_dir(tasks, "naive", NAIVE_TEST)
    task_dir(tasks, "broken", BROKEN_TEST)
    (tmp_path / "runner-token").write_text("runner")
    config = RunnerConfig.model_validate({
        "runner_token_file": str(tmp_path / "runner-token"), "pool": "p", "coordinator_url": "http://coordinator",
        "harness": {"kind": "custom", "name": "attacker", "dialect": "openai_chat",
                    "command": f": {{instruction}}; {attack}"},
        "tasks": {"kind": "dir", "path": str(tasks)}, "infra_retries": 0,
        "sandbox": {"kind": "local", "base_dir": str(tmp_path / "sb"), "memory_mb": 256},
    })
    assert config.sandbox.kind == "local"
    provider = LocalProvider(config.sandbox, prefix="p-r0", hide=[tasks])
    await provider.start()
    runner = Runner(config, adapter_for(config.harness), provider, load_dir(tasks),
                    httpx.AsyncClient(transport=proxy_transport()))
    lease = Lease(rollout_id="r1", lease_id="l1", task_id=task, harness="attacker", pool="p", group_id="g",
                  policy_version=0, model="tiny", proxy_url="http://proxy:8080", lease_deadline=time.time() + 600)
    completion = await runner.rollout(lease)
    assert completion.outcome == outcome, (completion.error, completion.grader_output)
    assert completion.correctness == 0.0
    assert (outcome in SCORED_OUTCOMES) == (task != "broken")  # scored 0 and trained on, but for a broken grader
    await provider.shutdown()
