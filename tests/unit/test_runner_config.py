"""RunnerConfig: what the operator renders, and the errors a bad config gets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from harnessrl.runtime.contracts.runner_config import (
    CustomHarnessSpec,
    KubernetesSandboxConfig,
    LocalSandboxConfig,
    RunnerConfig,
    load_config,
)
from pydantic import ValidationError

BASE = {
    "pool": "claude-pool",
    "harness": {"name": "claude-code"},
    "tasks": {"kind": "dir", "path": "examples/tasks"},
    "coordinator_url": "http://learner:8000",
    "runner_token_file": "/var/run/harnessrl/runner-token",
}


def test_minimal_config_defaults(tmp_path: Path) -> None:
    path = tmp_path / "runner.yaml"
    path.write_text(yaml.safe_dump(BASE))
    config = load_config(path)
    assert isinstance(config.sandbox, LocalSandboxConfig)
    assert config.harness.kind == "known" and config.concurrency == 4 and config.step_budget == 50


def test_custom_harness_and_kubernetes_sandbox() -> None:
    config = RunnerConfig.model_validate({
        **BASE,
        "harness": {"kind": "custom", "name": "my-agent", "command": "a {instruction}", "dialect": "anthropic"},
        "sandbox": {"kind": "kubernetes", "image": "ghcr.io/x/agent:1", "runtime_class_name": "gvisor",
                    "name_prefix": "run.pool.", "proxy_pod_labels": {"app": "proxy"}},
        "tasks": {"kind": "image", "image": "ghcr.io/x/tasks:1"},
    })
    assert isinstance(config.harness, CustomHarnessSpec)
    assert isinstance(config.sandbox, KubernetesSandboxConfig) and config.sandbox.runtime_class_name == "gvisor"


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"harness": {"name": "cursor"}}, "claude-code"),
        ({"tasks": {"kind": "image", "image": "x"}}, "kubernetes sandbox"),
        ({"concurrency": 0}, "greater than or equal to 1"),
        ({"pool": "Bad_Name"}, "pattern"),
        ({"sandbox": {"kind": "kubernetes", "image": "x"}}, "proxy_pod_labels"),
        # A prefix that does not end its own names could be the start of another pool's (`run.pool` of `run.pool-2.`).
        ({"sandbox": {"kind": "kubernetes", "image": "x", "name_prefix": "run.pool", "proxy_pod_labels": {"a": "b"}}},
         "pattern"),
        ({"unknown": 1}, "Extra inputs"),
    ],
)
def test_bad_configs_are_refused(patch: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RunnerConfig.model_validate({**BASE, **patch})
