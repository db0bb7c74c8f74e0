"""The e2b sandbox through the real `e2b` SDK against a stand-in speaking E2B's REST API and envd's Connect-RPC
process service on 127.0.0.1 (tests/fixtures/e2b_standin.py): create, commands, files in and out, grading, kill,
timeouts, and E2B's errors (rate limit, sandbox gone, unresponsive) as infrastructure errors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from harnessrl.runtime.contracts.runner_config import E2BSandboxConfig
from harnessrl.runtime.harness.sandboxes.base import SandboxError
from harnessrl.runtime.harness.sandboxes.e2b import E2BProvider
from harnessrl.runtime.harness.tasks import load_dir

from tests.fixtures.left_behind import beat_path, leave_walker

TASK = load_dir(Path(__file__).resolve().parents[2] / "examples" / "tasks")["sales-total"]


def provider(tmp_path: Path) -> E2BProvider:
    key = tmp_path / "e2b-key"
    key.write_text("e2b_test_key\n")
    config = E2BSandboxConfig(template="harness-base", api_key_file=key, proxy_public_url="https://proxy.example.com")
    return E2BProvider(config, pool="pool-a", runner_id="runner-0")


async def test_a_rollout_runs_and_is_graded_in_an_e2b_sandbox(e2b_standin: Any, tmp_path: Path) -> None:
    prov = provider(tmp_path)
    await prov.start()
    sb = await prov.open("rollout-1", TASK)
    (sid, created), = e2b_standin.sandboxes.items()
    assert created["template"] == "harness-base"
    assert created["metadata"] == {"managed-by": "harnessrl", "harnessrl-pool": "pool-a",
                                   "harnessrl-runner": "runner-0", "harnessrl-rollout": "rollout-1"}
    assert created["network"]["allowOut"] == ["proxy.example.com"]
    res = await sb.run(["sh", "-c", "head -1 sales.csv; echo to-stderr >&2; exit 3"], {}, 60)
    assert (res.exit_code, res.stdout, res.stderr, res.timed_out) == (
        3, "order_id,customer,region,date,amount\n", "to-stderr\n", False)
    await sb.write_files({f"{sb.workspace}/answer.txt": "5351\n"})
    assert await sb.read_file(f"{sb.workspace}/answer.txt") == "5351\n"
    graded = await sb.grade(TASK, 60)
    assert graded.grade is not None and graded.grade.reward == 1.0, graded
    # A wrong answer with a reward.txt the verifier cannot write (a directory) and a planted reward.json.
    await sb.write_files({f"{sb.workspace}/answer.txt": "1\n", f"{sb.logs_dir}/verifier/reward.json": '{"reward": 1}'})
    await sb.run(["sh", "-c", f"rm -f {sb.logs_dir}/verifier/reward.txt; mkdir {sb.logs_dir}/verifier/reward.txt"], {}, 60)
    assert (await sb.grade(TASK, 60)).grade.reward == 0.0  # type: ignore[union-attr]
    slow = await sb.run(["sleep", "60"], {}, 2)
    assert slow.timed_out and slow.exit_code == 137
    await sb.close()
    assert e2b_standin.killed == [sid] and e2b_standin.sandboxes == {}


async def test_a_restarted_runner_kills_what_its_predecessor_left(e2b_standin: Any, tmp_path: Path) -> None:
    await provider(tmp_path).open("left-behind", TASK)
    assert len(e2b_standin.sandboxes) == 1
    await provider(tmp_path).start()
    assert e2b_standin.sandboxes == {} and len(e2b_standin.killed) == 1


async def test_e2b_errors_are_infrastructure_errors(e2b_standin: Any, tmp_path: Path) -> None:
    prov = provider(tmp_path)
    e2b_standin.fail_create.extend([429] * 10)
    with pytest.raises(SandboxError, match="e2b creating a sandbox: rate limited"):
        await prov.open("r", TASK)
    e2b_standin.fail_create[:] = [503] * 10  # ServiceBusyException: not a SandboxException in the SDK
    with pytest.raises(SandboxError, match="e2b creating a sandbox: service busy"):
        await prov.open("r", TASK)
    e2b_standin.fail_create.clear()
    sb = await prov.open("r", TASK)
    e2b_standin.sandboxes.clear()  # E2B ended it (its own timeout)
    with pytest.raises(SandboxError, match="e2b running a command: sandbox not found"):
        await sb.run(["true"], {}, 10)
    await sb.close()  # already gone: closing is quiet
    sb = await prov.open("r2", TASK)
    e2b_standin.hang = True
    with pytest.raises(SandboxError, match="e2b running a command: timed out"):
        await sb._sh("true", 1.5)
    e2b_standin.hang = False
    await sb.close()


async def test_a_process_the_harness_left_is_gone_before_the_grader_runs(e2b_standin: Any, tmp_path: Path) -> None:
    """The attack: the harness leaves a process (tests/fixtures/left_behind.py) that keeps writing a reward of 1 and
    a test.sh that writes one, in a new process every few ms. Before, it outlived the `pkill -9 -u user -f .` run
    after each command and a wrong answer scored 1.0; now `kill -9 -1` ends it at once, its beat stops before the
    grader runs, and the answer scores 0. What the stand-in does not reproduce: its commands run as this test's
    user, not E2B's `user` (so the old pkill found no one here, where on E2B the walker slips past its one pass over
    /proc), in a PID namespace on this machine rather than E2B's VM."""
    prov = provider(tmp_path)
    sb = await prov.open("rollout-left", TASK)
    try:
        await sb.write_files({f"{sb.workspace}/answer.txt": "1\n"})
        await sb.run(leave_walker(sb.home, sb.logs_dir, sb.tests_dir), {}, 30)
        beat = await sb.read_file(beat_path(sb.home))
        await asyncio.sleep(0.5)
        assert beat is not None and await sb.read_file(beat_path(sb.home)) == beat, "the walker still runs"
        graded = await sb.grade(TASK, 60)
        assert graded.grade is not None and graded.grade.reward == 0.0, graded
        assert await sb.read_file(beat_path(sb.home)) == beat
        assert set(e2b_standin.users) == {"user"}  # never the template's default user, which may be root
    finally:
        await sb.close()
