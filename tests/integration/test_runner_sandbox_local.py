"""The local sandbox, with real processes: isolation between rollouts, limits, and that nothing a harness starts
outlives its rollout (normal exit, timeout, cancellation, runner restart)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harnessrl.runtime.contracts.runner_config import LocalSandboxConfig
from harnessrl.runtime.harness.sandboxes.local import LocalProvider, tagged_pids
from harnessrl.runtime.harness.tasks import load_dir

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"
TASK = load_dir(TASKS)["sales-total"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower().split("state:")[1].split("\n")[0]


@pytest.fixture
async def provider(tmp_path: Path) -> LocalProvider:
    token = tmp_path / "admin-token"
    token.write_text("s3cret")
    prov = LocalProvider(LocalSandboxConfig(base_dir=tmp_path / "sb", cpu_seconds=2, memory_mb=512), prefix="pool-r0",
                         hide=[TASKS, token])
    await prov.start()
    return prov


async def test_a_rollout_cannot_read_another_rollouts_workspace(provider: LocalProvider, tmp_path: Path) -> None:
    a, b = await provider.open("a", TASK), await provider.open("b", TASK)
    await b.write_files({f"{b.workspace}/secret.txt": "b's answer"})
    probe = (f"cat {b.workspace}/secret.txt; ls {b.root}; ls {provider.base_dir}; "
             f"cat {tmp_path / 'admin-token'}; ls {TASKS}; head -1 {a.workspace}/sales.csv")
    res = await a.run(["sh", "-c", probe], {}, 20)
    assert "b's answer" not in res.stdout and "s3cret" not in res.stdout
    # The base directory cannot be listed, b's directory does not exist there, a's own data is readable.
    assert res.stdout.split() == ["order_id,customer,region,date,amount"]
    assert f"{b.root}': No such file" in res.stderr and f"'{provider.base_dir}': Permission denied" in res.stderr
    # From outside (the runner) both are where they were.
    assert (b.root / "workspace" / "secret.txt").read_text() == "b's answer"
    await a.close()
    await b.close()
    assert list(provider.base_dir.iterdir()) == []


async def test_nothing_outlives_a_normal_exit(provider: LocalProvider) -> None:
    sb = await provider.open("daemon", TASK)
    # A daemon that leaves the process group and the session, then the command exits at once.
    res = await sb.run(["sh", "-c", "setsid sh -c 'sleep 300' >/dev/null 2>&1 & echo $!"], {}, 20)
    assert res.exit_code == 0 and not res.timed_out and int(res.stdout.strip()) < 10  # a PID of its own namespace
    assert tagged_pids(sb.name) == []
    await sb.close()


async def test_timeout_kills_the_whole_tree(provider: LocalProvider) -> None:
    sb = await provider.open("hang", TASK)
    started = time.monotonic()
    res = await sb.run(["sh", "-c", "(sleep 300 &); setsid sleep 300 & sleep 300"], {}, 1.5)
    assert res.timed_out and time.monotonic() - started < 10
    assert tagged_pids(sb.name) == []
    await sb.close()


async def test_cancellation_kills_the_harness(provider: LocalProvider) -> None:
    sb = await provider.open("cancel", TASK)
    run = asyncio.create_task(sb.run(["sh", "-c", "setsid sleep 300 & sleep 300"], {}, 600))
    deadline = time.monotonic() + 10
    while not tagged_pids(sb.name) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert tagged_pids(sb.name)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert tagged_pids(sb.name) == []
    await sb.close()
    assert not sb.root.exists()


async def test_cpu_and_memory_limits(provider: LocalProvider) -> None:
    sb = await provider.open("limits", TASK)
    hog = await sb.run([sys.executable, "-c", "b = bytearray(2 * 1024**3)"], {}, 60)
    assert hog.exit_code != 0 and "MemoryError" in hog.stderr
    spin = await sb.run([sys.executable, "-c", "while True: pass"], {}, 60)
    assert spin.exit_code == 128 + signal.SIGXCPU and not spin.timed_out  # RLIMIT_CPU (2 s) ended it (bwrap: 128+sig)
    await sb.close()


async def test_restarted_runner_reaps_what_the_last_one_left(tmp_path: Path) -> None:
    config = LocalSandboxConfig(base_dir=tmp_path / "sb")
    crashed = LocalProvider(config, prefix="pool-r0")
    await crashed.start()
    sb = await crashed.open("left", TASK)
    # A harness of the crashed runner, still running (started with the sandbox's tag, outside its control).
    env = {**os.environ, "HARNESSRL_SANDBOX": sb.name}
    orphan = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    other = LocalProvider(config, prefix="pool-r1")  # another runner's sandboxes stay
    await other.start()
    kept = await other.open("kept", TASK)
    try:
        await LocalProvider(config, prefix="pool-r0").start()
        assert orphan.wait(timeout=10) == -signal.SIGKILL
        assert not sb.root.exists() and kept.root.exists()
    finally:
        if orphan.poll() is None:
            orphan.kill()
        await kept.close()


async def test_a_harness_writing_answer_txt_does_not_touch_the_runners_directory(
    provider: LocalProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # How answer.txt once landed at the repository's root: a CLI run from the repo wrote into its cwd / $PWD.
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.chdir(repo)
    sb = await provider.open("answer", TASK)
    res = await sb.run(["sh", "-c", f'echo 42 > answer.txt; echo 42 > "{repo}/answer.txt"; echo 42 > "$OLDPWD/answer.txt"'],
                       {"OLDPWD": str(repo)}, 20)
    assert "answer.txt" in res.stderr  # the writes outside were refused
    assert list(repo.iterdir()) == []
    assert (Path(sb.workspace) / "answer.txt").read_text() == "42\n"
    await sb.close()


async def test_a_rollout_over_its_disk_limit_is_stopped(tmp_path: Path) -> None:
    """RLIMIT_FSIZE bounds each file, not their sum: four files of 8 MB passed an 8 MB cap. The rollout's total is
    watched while a command runs."""
    prov = LocalProvider(LocalSandboxConfig(base_dir=tmp_path / "sb", max_file_mb=8, max_disk_mb=16), prefix="pool-r0")
    await prov.start()
    async with await prov.open("r-disk", TASK) as sb:
        fill = "for i in 1 2 3 4 5 6; do head -c 7000000 /dev/urandom > f$i; done; sleep 30"
        res = await sb.run(["sh", "-c", fill], {}, 60)
        assert res.limit_exceeded and "over max_disk_mb 16" in res.limit_exceeded, res
        assert not res.timed_out and res.duration_s < 20
        small = await sb.run(["sh", "-c", "rm f*; echo ok"], {}, 60)
        assert small.limit_exceeded is None and small.stdout == "ok\n"


async def test_what_one_rollout_plants_does_not_stop_another(provider: LocalProvider) -> None:
    """FIFOs, /dev/zero and links where a runner once kept each command's output (io/N.out|err) and the verifier's
    files (logs/, tests/), and a FIFO for an answer: the runner opens none of them, so it grades that rollout wrong
    and another rollout runs and is graded beside it. (Before, opening io/2.out for the grading blocked the event
    loop, and every rollout of the runner with it.)"""
    plant = ("mv ../io ../io-was 2>/dev/null; rm -rf ../logs ../tests; mkdir -p ../io ../logs/verifier;"
             " for n in 1 2 3; do mkfifo ../io/$n.out; ln -s /dev/zero ../io/$n.err; done;"
             " mkfifo ../logs/verifier/reward.txt; ln -s /etc ../tests; mkfifo answer.txt")
    async with await provider.open("r-plant", TASK) as planted, await provider.open("r-other", TASK) as other:
        assert (await planted.run(["sh", "-c", plant], {}, 30)).exit_code == 0
        answering = asyncio.ensure_future(other.run(["sh", "-c", "sleep 1; echo 5351 > answer.txt"], {}, 30))
        graded = await asyncio.wait_for(planted.grade(TASK, 20), 40)
        assert (await asyncio.wait_for(answering, 30)).exit_code == 0
        assert graded.grade is not None and graded.grade.reward == 0.0, graded
        beside = await other.grade(TASK, 30)
        assert beside.grade is not None and beside.grade.reward == 1.0, beside

