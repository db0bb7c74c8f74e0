"""A batch whose sequences have no trainable token passes as a step without an update, live and on replay.

Such a batch used to raise in the trainer ("no trainable tokens"), and since the journal replays the same
completions into the same batch after a restart, the learner crash-looped."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from harnessrl.runtime.contracts.coordinator import Completion, LeaseRequest, OutcomeKind
from harnessrl.runtime.contracts.learner_config import LearnerConfig
from harnessrl.runtime.coordinator.journal import JournalEntry
from harnessrl.runtime.learner.loop import Learner
from harnessrl.runtime.trajectory.models import TrainingSequence

from tests.fixtures.runner_token import runner_token_file


def config(tmp_path: Path, model: Path) -> LearnerConfig:
    token = tmp_path / "admin-token"
    token.write_text("t")
    return LearnerConfig.model_validate({
        "model": {"path": str(model), "served_name": "tiny", "device": "cpu"},
        "grpo": {"group_size": 2, "groups_per_step": 1, "steps": 3},
        "harnesses": [{"pool": "p", "harness": "mini"}],
        "tasks": {"ids": ["t0", "t1"]},
        "proxy": {"url": "http://127.0.0.1:9", "admin_token_file": str(token)},
        "engine": {"urls": ["http://127.0.0.1:9/v1"]},
        "checkpoint": {"dir": str(tmp_path / "ck")},
        "runner_token_file": str(runner_token_file(tmp_path)),
    })


def untrainable(session: str) -> TrainingSequence:
    # Context only: the rollout's turns captured no sampled token after position 0.
    return TrainingSequence(session_id=session, node_ids=[0], token_ids=[5, 6, 7], loss_mask=[1, 0, 0],
                            logprobs=[-0.1, 0.0, 0.0], policy_versions=[0, 0, 0])


def test_zero_trainable_tokens_step_without_update_live_and_on_replay(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = config(tmp_path, tiny_model_dir)
    learner = Learner(cfg)
    leases = learner.coordinator.lease(LeaseRequest(runner_id="r", pool="p", harness="mini", max=2), now=time.time())
    assert len(leases) == 2
    for lease, (outcome, correct) in zip(leases, [(OutcomeKind.solved, 1.0), (OutcomeKind.wrong, 0.0)], strict=True):
        c = Completion(rollout_id=lease.rollout_id, lease_id=lease.lease_id, session_id=lease.rollout_id,
                       outcome=outcome, correctness=correct, tool_calls=1)
        seqs = [untrainable(lease.rollout_id)]
        assert learner.coordinator.complete(c, seqs).status == "accepted"
        learner.journal.append(JournalEntry(seq=learner.coordinator.state.journal_seq, completion=c, sequences=seqs))
    batch = learner.coordinator.take_batch(1)
    assert batch is not None and len(batch.groups) == 1  # rewards differ: a trainable group by its advantages
    asyncio.run(learner.step(batch))
    assert (learner.coordinator.state.step, learner.coordinator.state.policy_version) == (1, 0)
    learner.journal.close()

    # A restart before any checkpoint replays both completions into the same batch: it must pass again.
    again = Learner(cfg)
    assert again.coordinator.state.step == 0
    batch = again.coordinator.take_batch(1)
    assert batch is not None
    asyncio.run(again.step(batch))
    assert (again.coordinator.state.step, again.coordinator.state.policy_version) == (1, 0)
    again.journal.close()
