"""Checkpoints on a volume: weights or adapter, optimizer, coordinator state, RNG, metrics — for exact resume.

Layout: <dir>/step-<N>/{policy/, optimizer.pt, coordinator.json, rng.pt, metrics.jsonl, meta.json} and
<dir>/latest (the newest complete step dir's name). A checkpoint is written to a temporary dir and renamed,
then `latest` is replaced, so a crash at any moment leaves the previous checkpoint intact. The newest `keep`
step dirs stay, and the best one by held-out pass@1 (evaluation.best_round) beside them.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Sequence
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


def save_checkpoint(
    root: Path,
    model: Any,
    policy_state: dict[str, Any],
    optimizer_state: dict[str, Any],
    state: CoordinatorState,
    metrics_file: Path,
    adapter_kind: str,
    keep: int,
    evals: Sequence[EvalRecord] = (),
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(state.step)
    tmp = root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    # The gathered full state: the model itself may hold only this rank's shards (FSDP2).
    model.save_pretrained(tmp / "policy", state_dict=policy_state)
    torch.save(optimizer_state, tmp / "optimizer.pt")
    (tmp / "coordinator.json").write_text(state.model_dump_json(exclude_computed_fields=True))
    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, tmp / "rng.pt")
    if metrics_file.exists():
        shutil.copyfile(metrics_file, tmp / "metrics.jsonl")
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
    _prune(root, keep, evals)
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
