"""The learner's processes under torchrun: who they are, how the model is sharded (FSDP2), which sequences each
one trains on, and how the command of rank 0 reaches the others.

One process is a world of one (no process group). Under `torchrun --nproc-per-node N` every process loads the
model, wraps it with `fully_shard` (FSDP2: fp32 sharded master weights, bf16 compute on GPU, fp32 gradient
reduction) and trains on its own share of each step's sequences; rank 0 alone runs the coordinator, publishes
weights and exports.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")
# Rank 0 may wait for rollouts for hours between steps while the others wait for its next command; the
# commands travel on their own CPU (gloo) group with this timeout, the tensors on the default group.
COMMAND_TIMEOUT = timedelta(days=7)
_command_group: Any = None


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @classmethod
    def from_env(cls) -> World:
        """The world torchrun describes in RANK / WORLD_SIZE / LOCAL_RANK (a world of one without them)."""
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            size=int(os.environ.get("WORLD_SIZE", "1")),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        )


def init_world(device_type: str) -> World:
    """Join torchrun's process group (NCCL on GPUs, gloo on CPUs); a single process needs none."""
    global _command_group
    world = World.from_env()
    if world.distributed and not dist.is_initialized():
        if device_type == "cuda":
            torch.cuda.set_device(world.local_rank)
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
        _command_group = dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)
    return world


def device_for(world: World, device_type: str) -> torch.device:
    return torch.device("cuda", world.local_rank) if device_type == "cuda" else torch.device(device_type)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a causal LM (under a PEFT wrapper too): FSDP2's unit of sharding."""
    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, torch.nn.ModuleList):
            return list(module)
    raise ValueError(f"{type(model).__name__} has no `layers` ModuleList to shard")


def shard(model: torch.nn.Module, world: World, device_type: str, compute_dtype: torch.dtype) -> torch.nn.Module:
    """FSDP2 over every decoder layer and the root: fp32 parameters sharded across ranks, gathered in
    `compute_dtype` for forward/backward, gradients reduced in fp32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device_type, (world.size,))
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def rank_share(items: list[T], weights: list[int], world: World) -> list[T]:
    """This rank's share of `items`: greedy longest-first onto the least-loaded rank (by `weights`, e.g. tokens),
    ties to the lower rank, then back in the original order. The same on every rank: no communication."""
    if not world.distributed:
        return list(items)
    load = [0] * world.size
    owner = [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (-weights[i], i)):
        r = min(range(world.size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += weights[i]
    return [items[i] for i in range(len(items)) if owner[i] == world.rank]


def _comm_device(world: World) -> torch.device:
    # NCCL reduces only tensors on the GPU; gloo takes CPU tensors.
    return torch.device("cuda", world.local_rank) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_sum(values: list[float], world: World) -> list[float]:
    """Element-wise sum over ranks (identity in a world of one)."""
    if not world.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device(world))
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return [float(v) for v in t.cpu().tolist()]


def all_max(value: int, world: World) -> int:
    if not world.distributed:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=_comm_device(world))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def broadcast(obj: Any, world: World) -> Any:
    """Rank 0's `obj` on every rank (pickled, over the command group where init_world made one)."""
    if not world.distributed:
        return obj
    box = [obj if world.is_main else None]
    dist.broadcast_object_list(box, src=0, group=_command_group)
    return box[0]
