"""Rank 0 leads, the other ranks follow: every call on the trainer that needs all ranks (a step, gathering the
weights or the optimizer state) is first announced by rank 0, which alone runs the coordinator, publishes
weights, writes checkpoints and exports; the others run `follow` until told to stop."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
from harnessrl.runtime.learner.distributed import World, broadcast
from harnessrl.runtime.learner.packing import Sample
from harnessrl.runtime.learner.trainer import PolicyTrainer, StepStats


class Command(StrEnum):
    STEP = "step"
    POLICY_STATE = "policy_state"
    OPTIMIZER_STATE = "optimizer_state"
    STOP = "stop"


class Lead:
    """Rank 0's handle on the trainer (in a world of one, the trainer itself with nothing announced)."""

    def __init__(self, trainer: PolicyTrainer, world: World):
        self.trainer = trainer
        self.world = world

    @property
    def model(self) -> torch.nn.Module:
        return self.trainer.model

    def _announce(self, command: Command, arg: Any = None) -> None:
        if self.world.distributed:
            broadcast((command, arg), self.world)

    def step(self, samples: list[Sample]) -> StepStats:
        self._announce(Command.STEP, samples)
        return self.trainer.step(samples)

    def policy_state(self) -> dict[str, torch.Tensor]:
        self._announce(Command.POLICY_STATE)
        return self.trainer.policy_state()

    def optimizer_state(self) -> dict[str, Any]:
        self._announce(Command.OPTIMIZER_STATE)
        return self.trainer.optimizer_state()

    def published(self) -> Any:
        """The model as weight sync saves it: sharded weights gathered first."""
        if not self.world.distributed:
            return self.trainer.model
        return Gathered(self.trainer.model, self.policy_state())

    def stop(self) -> None:
        self._announce(Command.STOP)


class Gathered:
    """A sharded model's `save_pretrained` with its gathered full state (everything else from the model)."""

    def __init__(self, model: Any, state: dict[str, torch.Tensor]):
        self._model = model
        self._state = state

    def save_pretrained(self, path: Path, **kwargs: Any) -> None:
        self._model.save_pretrained(path, state_dict=self._state, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def follow(trainer: PolicyTrainer, world: World) -> None:
    """A rank other than 0: make each call rank 0 announces, until it says stop."""
    while True:
        command, arg = broadcast(None, world)
        if command == Command.STEP:
            trainer.step(arg)
        elif command == Command.POLICY_STATE:
            trainer.policy_state()
        elif command == Command.OPTIMIZER_STATE:
            trainer.optimizer_state()
        elif command == Command.STOP:
            return
        else:
            raise RuntimeError(f"rank {world.rank}: unknown command {command!r} from rank 0")
