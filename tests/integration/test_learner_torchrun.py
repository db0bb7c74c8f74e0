"""`harnessrl learner` under torchrun, 2 processes (gloo on CPU, FSDP2), full fine-tuning: rank 0 serves the
coordinator and the other rank follows it through every step, weight publish (restart sync: files) and
checkpoint, and both exit 0 after the last step. The checkpoint they wrote resumes in one process.

Same stand-ins as test_learner_resume.py: the proxy's admin protocol and a synthetic harness."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import torch
from harnessrl.runtime.contracts.learner_config import load_config
from harnessrl.runtime.learner.distributed import World
from harnessrl.runtime.learner.loop import build_trainer

from tests.fixtures.hub_server import HubServer
from tests.fixtures.learner_process import ProxyStandIn, start_learner
from tests.integration.test_learner_resume import SyntheticHarness, config
from tests.ports import free_port

pytestmark = pytest.mark.slow


def test_two_ranks_train_publish_checkpoint_and_finish(tmp_path: Path, tiny_model_dir: Path, hub_server: HubServer,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESSRL_TEST_HUB_TOKEN", hub_server.token)
    proxy = ProxyStandIn("tiny", "admin-secret")
    proxy.start()
    token_file = tmp_path / "admin-token"
    token_file.write_text(proxy.admin_token)
    cfg = config(tmp_path, tiny_model_dir, proxy, token_file, hub_server)
    cfg |= {"adapter": {"kind": "full"}, "export": None, "grpo": cfg["grpo"] | {"steps": 2, "micro_batch_tokens": 32},
            "checkpoint": cfg["checkpoint"] | {"every": 1}}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
                "--master-addr=127.0.0.1", f"--master-port={free_port()}", "--no-python"]
    learner = start_learner(tmp_path, cfg, timeout_s=240, launcher=torchrun)
    try:
        asyncio.run(SyntheticHarness(proxy).run(learner.url, lambda: False, timeout_s=240))
        learner.proc.wait(timeout=120)
        log = learner.log()
        assert learner.proc.returncode == 0, log[-4000:]
        ckpt = tmp_path / "ckpt"
        steps = [json.loads(ln)["step"] for ln in (ckpt / "metrics.jsonl").read_text().splitlines()]
        assert steps == [1, 2]
        assert (ckpt / "latest").read_text() == "step-0000002"
        assert json.loads((ckpt / "sync" / "policy.json").read_text())["version"] == 2
        # Only rank 0 served the coordinator: the port was bound once.
        assert "address already in use" not in log.lower()
    finally:
        learner.stop()
        proxy.stop()
    # The 2-process checkpoint resumes in 1, with the gathered weights and AdamW moments.
    trainer, latest = build_trainer(load_config(tmp_path / "learner.yaml"), world=World())
    assert latest is not None and latest.name == "step-0000002"
    saved = torch.load(latest / "optimizer.pt", weights_only=True)["state"]
    state = trainer.optimizer_state()["state"]
    assert saved.keys() == state.keys() and saved
    for name in saved:
        torch.testing.assert_close(state[name]["exp_avg"], saved[name]["exp_avg"])

