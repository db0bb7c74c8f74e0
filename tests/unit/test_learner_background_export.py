"""Hub export runs off the training step's critical path (runtime/learner/background.py), and a crash while
an export is in flight still resumes from the checkpoint already written."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from harnessrl.runtime.learner.background import LatestOnlyWorker
from harnessrl.runtime.learner.hub import HubExporter
from harnessrl.runtime.learner.loop import Learner

from tests.unit.test_learner_zero_tokens import config


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
    path = asyncio.run(learner.checkpoint())
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
