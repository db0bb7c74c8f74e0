"""Sandboxes behind one interface (base.py): local, kubernetes, e2b."""

from __future__ import annotations

from pathlib import Path

from harnessrl.runtime.contracts.runner_config import (
    E2BSandboxConfig,
    KubernetesSandboxConfig,
    LocalSandboxConfig,
    RunnerConfig,
)
from harnessrl.runtime.harness.sandboxes.base import SandboxError, SandboxProvider


def make_provider(config: RunnerConfig, hide: list[Path]) -> SandboxProvider:
    """The provider for the pool's sandbox kind. `hide`: host paths a local sandbox must not expose."""
    prefix = f"{config.pool}-{config.runner_id}"
    sandbox = config.sandbox
    if isinstance(sandbox, LocalSandboxConfig):
        from harnessrl.runtime.harness.sandboxes.local import LocalProvider

        return LocalProvider(sandbox, prefix=prefix, hide=hide)
    if isinstance(sandbox, KubernetesSandboxConfig):
        from harnessrl.runtime.harness.sandboxes.kubernetes import KubernetesProvider

        deadline_s = int(config.timeouts.harness_s + config.timeouts.grader_s)
        return KubernetesProvider(sandbox, pool=config.pool, runner_id=config.runner_id, deadline_s=deadline_s)
    assert isinstance(sandbox, E2BSandboxConfig)
    from harnessrl.runtime.harness.sandboxes.e2b import E2BProvider

    return E2BProvider(sandbox, pool=config.pool, runner_id=config.runner_id)


__all__ = ["SandboxError", "SandboxProvider", "make_provider"]
