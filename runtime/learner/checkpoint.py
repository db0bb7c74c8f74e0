"""Checkpoints on a volume: weights or adapter, optimizer, coordinator state, RNG, metrics — for exact resume.

Layout: <dir>/step-<N>/{policy/, optimizer.pt, coordinator.json, rng.pt, metrics.jsonl, meta.json} and
<dir>/latest (the newest complete step dir's name). A checkpoint is written to a temporary dir and renamed,
then `latest` is replaced, so a crash at any moment leaves the previous checkpoint intact. The newest `keep`
step dirs stay, and the best one by held-out pass@1 (evaluation.best_round) beside them. A checkpoint is a
`Snapshot` taken between two steps and written while the next one trains (the learner's loop).
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from harnessrl.runtime.contracts.coordinator import EvalRecord
from harnessrl.runtime.learner.coordinator import CoordinatorState
from harnessrl.runtime.learner.evaluation import best_round
from pydantic import BaseModel


class CheckpointMeta(BaseModel):
    step: int
    policy_version: int
    policy_model: str
    adapter_kind: str
    written_at: float


def step_dir_name(step: int) -> str:
    return f"step-{step:07d}"


@dataclass(frozen=True)
class Snapshot:
    """What a checkpoint holds, taken between two steps (the weights and optimizer state as copies of their own),
    so that writing it can go on while the next step trains."""

    state: CoordinatorState
    policy: dict[str, Any]
    optimizer: dict[str, Any]
    rng: dict[str, Any]
    metrics: bytes | None
    evals: Sequence[EvalRecord]


def take_snapshot(state: CoordinatorState, policy: dict[str, Any], optimizer: dict[str, Any], metrics_file: Path,
                  evals: Sequence[EvalRecord] = ()) -> Snapshot:
    """The snapshot with the RNG state and metrics as they are now; `policy` and `optimizer` must be copies."""
    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    metrics = metrics_file.read_bytes() if metrics_file.exists() else None
    return Snapshot(state=state, policy=policy, optimizer=optimizer, rng=rng, metrics=metrics, evals=tuple(evals))


def write_checkpoint(root: Path, model: Any, snapshot: Snapshot, adapter_kind: str, keep: int) -> Path:
    """Write `snapshot` as `<root>/step-<N>` and point `latest` at it; `model` saves `snapshot.policy` in its
    own format (config, adapter layout), not its live weights."""
    state = snapshot.state
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(state.step)
    tmp = root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    # The gathered full state: the model itself may hold only this rank's shards (FSDP2).
    model.save_pretrained(tmp / "policy", state_dict=snapshot.policy)
    torch.save(snapshot.optimizer, tmp / "optimizer.pt")
    (tmp / "coordinator.json").write_text(state.model_dump_json(exclude_computed_fields=True))
    torch.save(snapshot.rng, tmp / "rng.pt")
    if snapshot.metrics is not None:
        (tmp / "metrics.jsonl").write_bytes(snapshot.metrics)
    meta = CheckpointMeta(
        step=state.step,
        policy_version=state.policy_version,
        policy_model=state.policy_model,
        adapter_kind=adapter_kind,
        written_at=time.time(),
    )
    (tmp / "meta.json").write_text(meta.model_dump_json())
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (root / ".latest.tmp").write_text(final.name)
    (root / ".latest.tmp").replace(root / "latest")
    _prune(root, keep, snapshot.evals)
    return final


def _prune(root: Path, keep: int, evals: Sequence[EvalRecord]) -> None:
    dirs = sorted(p for p in root.glob("step-*") if p.is_dir())
    # The best checkpoint is the one to use after the run: the rotation must not take it.
    best = best_round(evals, {int(p.name.removeprefix("step-")) for p in dirs})
    for old in dirs[:-keep]:
        if best is None or old.name != step_dir_name(best.step):
            shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(root: Path) -> Path | None:
    pointer = root / "latest"
    if not pointer.exists():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "meta.json").exists() else None


class LoadedCheckpoint(BaseModel):
    path: Path
    meta: CheckpointMeta
    state: CoordinatorState


def read_checkpoint(path: Path) -> LoadedCheckpoint:
    return LoadedCheckpoint(
        path=path,
        meta=CheckpointMeta.model_validate_json((path / "meta.json").read_text()),
        state=CoordinatorState.model_validate_json((path / "coordinator.json").read_text()),
    )


def load_optimizer_state(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path / "optimizer.pt", weights_only=True)
    return state


def restore_rng(path: Path) -> None:
    rng = torch.load(path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
