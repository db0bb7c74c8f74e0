"""FSDP2 under torchrun (2 processes, gloo on CPU) against one process: the same loss and the same weights
after each step, for LoRA and full fine-tuning; and the checkpoint the 2 processes wrote resumes in 1 (weights
and optimizer state: the step after it lands where the 2 processes' second step did).

The 2-process side is tests/fixtures/learner_fsdp.py, run by the real torchrun; the single-process side runs
here with the same code and batches.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from harnessrl.runtime.contracts.learner_config import AdapterConfig, ModelConfig
from harnessrl.runtime.learner.checkpoint import latest_checkpoint, load_optimizer_state
from harnessrl.runtime.learner.packing import split_by_tokens, split_mini_batches
from harnessrl.runtime.learner.trainer import PolicyTrainer, load_policy

from tests.fixtures.learner_fsdp import GRPO, KINDS, batch, trainable_state
from tests.ports import free_port

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "learner_fsdp.py"
# fp32 on CPU; the two worlds sum gradients in a different order (reduce-scatter vs one backward), and Adam
# divides by sqrt(v): where a gradient is ~0 that order moves a weight by up to ~1e-5 at lr 1e-3.
TOL = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(scope="module")
def two_processes(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(SCRIPT), str(tiny_model_dir), str(out)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        log, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.decode(errors="replace")[-4000:]
    return out


def one_process(model_dir: Path, kind: str, adapter_dir: Path | None = None) -> PolicyTrainer:
    path = adapter_dir.parent / "policy" if adapter_dir is not None and kind == "full" else model_dir
    cfg = ModelConfig(path=path, served_name="tiny", dtype="float32", device="cpu")
    model = load_policy(cfg, AdapterConfig(kind=kind, rank=4), adapter_dir if kind == "lora" else None)
    return PolicyTrainer(model, GRPO)


def assert_states_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys() and got
    for name in want:
        torch.testing.assert_close(got[name], want[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("kind", KINDS)
def test_two_processes_train_like_one(two_processes: Path, tiny_model_dir: Path, kind: str) -> None:
    torch.manual_seed(0)
    dist = torch.load(two_processes / kind / "result.pt", weights_only=True)
    trainer = one_process(tiny_model_dir, kind)
    vocab = int(trainer.model.config.vocab_size)
    start = trainable_state(trainer)
    first = trainer.step(batch(1, vocab))
    assert_states_close(dist["after_first"], trainable_state(trainer))
    second = trainer.step(batch(2, vocab))
    assert_states_close(dist["after_second"], trainable_state(trainer))
    assert dist["loss"] == pytest.approx([first.loss, second.loss], rel=1e-5, abs=1e-7)
    assert dist["tokens"] == [first.tokens, second.tokens]
    assert any(not torch.equal(start[n], dist["after_second"][n]) for n in start), "nothing trained"


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_of_two_processes_resumes_in_one(two_processes: Path, tiny_model_dir: Path, kind: str) -> None:
    ck = latest_checkpoint(two_processes / kind / "ck")
    assert ck is not None
    dist = torch.load(two_processes / kind / "result.pt", weights_only=True)
    trainer = one_process(tiny_model_dir, kind, ck / "policy")
    assert_states_close(trainable_state(trainer), dist["after_first"])
    trainer.load_optimizer_state(load_optimizer_state(ck))
    vocab = int(trainer.model.config.vocab_size)
    # Step 1's updates: its mini-batches, each split by the per-update token budget (more than one per mini-batch).
    updates = sum(len(split_by_tokens(m, GRPO.max_tokens_per_step))
                  for m in split_mini_batches(batch(1, vocab), GRPO.mini_batches))
    assert updates > GRPO.mini_batches
    moments = trainer.optimizer_state()["state"]
    assert moments and all(int(s["step"]) == updates for s in moments.values())
    trainer.step(batch(2, vocab))
    assert_states_close(trainable_state(trainer), dist["after_second"])
