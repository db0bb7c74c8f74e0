"""Which GPUs each process of `harnessrl run` sees: every engine replica and the learner on GPUs of their own
(CUDA_VISIBLE_DEVICES), and the learner under `harnessrl torchrun` when it has more than one. Pure but for
`gpu_ids`, which reads the machine.

Without this every process saw every GPU and took cuda:0: the engines (gpu_memory_utilization 0.9 each) and
the learner on one device, and a learner of several GPUs ran as one process on one of them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from harnessrl.operator.plan.types import Plan
from harnessrl.runtime.programs import python_module

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def gpu_ids(environ: Mapping[str, str], dev: Path = Path("/dev")) -> list[str]:
    """The NVIDIA GPUs a process started here can use: CUDA_VISIBLE_DEVICES where it is set (as CUDA reads it:
    up to the first invalid entry), else the /dev/nvidiaN device files. No CUDA library is loaded for this."""
    visible = environ.get(CUDA_VISIBLE_DEVICES)
    if visible is None:
        return sorted((p.name[len("nvidia"):] for p in dev.glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)), key=int)
    ids = []
    for entry in visible.split(","):
        if not re.fullmatch(r"\s*(\d+|GPU-[0-9a-fA-F-]+|MIG-[0-9a-zA-Z/-]+)\s*", entry) or entry.strip() == "-1":
            break
        ids.append(entry.strip())
    return ids


def engine_process(replica: int) -> str:
    return f"engine-{replica}"


def visible_devices(plan: Plan, available: list[str]) -> dict[str, str]:
    """Process name (engine-<i>, the learner's component name) -> its CUDA_VISIBLE_DEVICES, engines first; a
    process without GPUs sees none. Raises ValueError when they need more GPUs than `available`."""
    wants = [(engine_process(i), plan.engine.gpus) for i in range(plan.engine.replicas)] if plan.engine else []
    wants.append((plan.learner.name, plan.learner.gpus))
    needed = sum(n for _, n in wants)
    if needed > len(available):
        listed = ", ".join(f"{name} {n}" for name, n in wants if n)
        raise ValueError(f"the run needs {needed} GPUs ({listed}), and this machine has {len(available)}"
                         f"{' (' + ','.join(available) + ')' if available else ''}: each process gets GPUs of its own")
    out: dict[str, str] = {}
    start = 0
    for name, n in wants:
        out[name] = ",".join(available[start:start + n])
        start += n
    return out


def learner_argv(gpus: int, config: Path) -> list[str]:
    """`harnessrl learner`, under `harnessrl torchrun` (one process per GPU, FSDP2) when it has several GPUs."""
    learner = ["learner", "--config", str(config)]
    if gpus <= 1:
        return python_module("harnessrl.cli", *learner)
    # torchrun starts each worker as `<training_script> ARGS` (--no-python): the same bootstrap, under this
    # interpreter, instead of a console script that may not sit beside it.
    return python_module("harnessrl.cli", "torchrun", "--standalone", f"--nproc-per-node={gpus}", "--no-python",
                         *python_module("harnessrl.cli", *learner))
