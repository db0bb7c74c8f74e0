"""Checkpoint writes and Hub exports run off the training step's critical path: a checkpoint is a snapshot
written while the next step trains, and holds its own step's state; a Hub export runs in the background
(runtime/learner/background.py), and a crash while one is in flight still resumes from the checkpoint written."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from harnessrl.runtime.contracts.learner_config import AdapterConfig, GrpoConfig, LearnerConfig, ModelConfig
from harnessrl.runtime.learner import loop
from harnessrl.runtime.learner.background import LatestOnlyWorker
from harnessrl.runtime.learner.hub import HubExporter
from harnessrl.runtime.learner.loop import Learner
from harnessrl.runtime.learner.trainer import PolicyTrainer, load_policy
from safetensors.torch import load_file

from tests.unit.test_learner_precision import samples
from tests.unit.test_learner_zero_tokens import config


def checkpointed(learner: Learner) -> Path:
    async def both() -> Path:
        await learner.checkpoint()
        return await learner.checkpoint_written()

    return asyncio.run(both())


def test_a_newer_item_replaces_a_waiting_one_and_drain_waits_for_the_last() -> None:
    started, release = threading.Event(), threading.Event()
    done: list[int] = []

    def work(i: int) -> None:
        started.set()
        release.wait(30)
        done.append(i)

    w = LatestOnlyWorker(work, "test")
    w.submit(1)
    assert started.wait(30)
    w.submit(2)
    w.submit(3)  # 2 never ran: only the newest waiting item matters
    assert not w.drain(timeout_s=0.05)
    release.set()
    assert w.drain(timeout_s=30)
    assert done == [1, 3] and w.replaced == 1
    w.close()


def test_checkpoint_does_not_wait_for_the_hub_and_a_crash_mid_export_resumes(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uploading, release = threading.Event(), threading.Event()

    def slow_export(self: HubExporter, path: Path, history: Any) -> str:
        uploading.set()
        release.wait(60)
        return f"rev-{path.name}"

    monkeypatch.setattr(HubExporter, "export", slow_export)
    token = tmp_path / "hub-token"
    token.write_text("hf_x")
    cfg = config(tmp_path, tiny_model_dir).model_copy(update={"export": {"repo": "org/m", "token_file": token}})
    cfg = type(cfg).model_validate(cfg.model_dump())
    learner = Learner(cfg)
    path = checkpointed(learner)
    # train() hands it over once this step's evaluation round (none here) is recorded; it returns while the
    # upload is still running.
    assert learner.unexported == path and not uploading.is_set()
    learner.export()
    assert uploading.wait(30) and learner.coordinator.artifacts.hub_revision is None
    # The process dies here; its successor resumes from the checkpoint written before the export began.
    learner.journal.close()
    again = Learner(cfg)
    assert again.coordinator.artifacts.latest_checkpoint == str(path) and again.unexported == path  # exported again
    release.set()
    assert learner.exports is not None and learner.exports.drain(timeout_s=60)
    assert learner.coordinator.artifacts.hub_revision == f"rev-{path.name}"
    again.journal.close()


def test_the_next_step_trains_while_a_checkpoint_is_written_and_the_checkpoint_keeps_its_step(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writing, release = threading.Event(), threading.Event()
    write = loop.write_checkpoint

    def slow_write(*args: Any) -> Path:
        writing.set()
        release.wait(60)
        return write(*args)

    monkeypatch.setattr(loop, "write_checkpoint", slow_write)
    cfg = config(tmp_path, tiny_model_dir).model_dump()
    full = {"adapter": {"kind": "full"}, "engine": cfg["engine"] | {"sync": "restart"}}
    learner = Learner(LearnerConfig.model_validate(cfg | full))
    trainer = learner.trainer.trainer
    batch = samples(trainer.model.config.vocab_size)
    trainer.step(batch)  # so that AdamW has state to checkpoint
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    moments = {k: v.clone() for k, v in trainer.optimizer.state[next(trainer.model.parameters())].items()}
    rng = torch.get_rng_state()

    async def step_during_the_write() -> Path:
        await learner.checkpoint()
        assert await asyncio.to_thread(writing.wait, 30)
        # The step runs to its end while the write cannot go on: it does not wait for the write.
        await asyncio.to_thread(learner.trainer.step, batch)
        torch.rand(8)
        assert not learner.writing.done()
        release.set()
        return await learner.checkpoint_written()

    path = asyncio.run(step_during_the_write())
    changed = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, weights[k])]
    assert changed  # the second step moved the live weights ...
    saved = load_file(next((path / "policy").glob("*.safetensors")))
    assert saved.keys() <= weights.keys() and set(changed) & saved.keys()
    assert all(torch.equal(saved[k], weights[k]) for k in saved)  # ... and the checkpoint holds the first step's
    optimizer = torch.load(path / "optimizer.pt", weights_only=True)["state"]
    first = next(iter(optimizer.values()))
    assert all(torch.equal(first[k], moments[k]) for k in moments) and not torch.equal(
        first["exp_avg"], trainer.optimizer.state[next(trainer.model.parameters())]["exp_avg"])
    assert torch.equal(torch.load(path / "rng.pt", weights_only=False)["torch"], rng)
    assert learner.coordinator.artifacts.latest_checkpoint == str(path)
    learner.journal.close()


def test_the_state_a_checkpoint_writes_is_a_copy_with_tied_weights_still_one_tensor(tiny_model_dir: Path) -> None:
    model = load_policy(ModelConfig(path=tiny_model_dir, served_name="tiny", device="cpu"), AdapterConfig(kind="full"))
    trainer = PolicyTrainer(model, GrpoConfig(), compute=torch.float32)
    trainer.step(samples(model.config.vocab_size))
    live = {t.data_ptr() for t in model.parameters()}
    live |= {t.data_ptr() for s in trainer.optimizer.state.values() for t in s.values()}
    policy, optimizer = trainer.policy_state(), trainer.optimizer_state()
    copied = [*policy.values(), *(t for s in optimizer["state"].values() for t in s.values())]
    assert not live & {t.data_ptr() for t in copied}
    # The tiny model ties its LM head to its embeddings: the copy does too, as the model's own state dict did.
    assert policy["lm_head.weight"] is policy["model.embed_tokens.weight"]
