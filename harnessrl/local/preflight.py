"""What `harnessrl run` checks on this machine before it downloads or starts anything: the volumes it was given,
the GPUs the spec asks for, and that the local sandbox can isolate rollouts. Each check returns the problem in
the user's terms (the flag to pass, the package to install, the field to change), or None.

These checks exist because the first sign of each problem used to come minutes in: after a model download, or
when a runner started and found no bubblewrap (`make demo` on a fresh machine).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from harnessrl.operator.api.common import VolumePath
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.runtime.contracts.runner_config import LocalSandboxConfig
from harnessrl.runtime.harness.sandboxes import bwrap


def volume_problem(ref: VolumePath, volumes: Mapping[str, Path], what: str) -> str | None:
    """A PVC path on this machine: `--volume CLAIM=DIR` must say where the claim's files are, and they must exist."""
    if ref.claim_name not in volumes:
        return (f"{what} reads PersistentVolumeClaim {ref.claim_name!r}; pass --volume {ref.claim_name}=DIR "
                "to say where its files are on this machine")
    path = volume_path(ref, volumes)
    if not path.exists():
        return f"{what}: {path} (volume {ref.claim_name}) does not exist"
    return None


def volume_path(ref: VolumePath, volumes: Mapping[str, Path]) -> Path:
    return volumes[ref.claim_name] / ref.path.lstrip("/")


def gpu_problem(spec: TrainingRunSpec, available: int) -> str | None:
    """The learner and the run's own engines all run here: their GPUs must be here too."""
    learner = spec.learner.gpus * spec.learner.nodes
    engine = 0 if spec.engine.pool else spec.engine.gpus * spec.engine.replicas
    if learner + engine <= available:
        return None
    asks = [f"learner.gpus {spec.learner.gpus}" + (f" x {spec.learner.nodes} nodes" if spec.learner.nodes > 1 else ""),
            f"engine.gpus {spec.engine.gpus} x {spec.engine.replicas} replica(s)"]
    return (f"spec.{' and spec.'.join(asks)} need {learner + engine} GPU(s); this machine has {available} "
            "(CUDA_VISIBLE_DEVICES, else /dev/nvidiaN): set them to 0 to run on the CPU")


def sandbox_problem(pool: str, sandbox: LocalSandboxConfig) -> str | None:
    """A pool's local sandbox refuses to start without bubblewrap (and, for a root runner, setpriv) unless it
    allows unisolated rollouts: the same probe its runner makes at start, made now."""
    if sandbox.allow_unisolated:
        return None
    with tempfile.TemporaryDirectory(prefix="harnessrl-preflight-") as scratch:
        plan = bwrap.BwrapPlan(bwrap="bwrap", rollout_dir=Path(scratch), read_only=(),
                               share_net=sandbox.network == "host",
                               drop_to=sandbox.run_as_uid if os.geteuid() == 0 else None)
        why = bwrap.probe(plan)
    if why is None:
        return None
    return (f"HarnessPool {pool}: the local sandbox cannot isolate rollouts here: {why} "
            "(or set sandbox.local.allowUnisolated: true)")
