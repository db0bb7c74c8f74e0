"""LearnerConfig validation (errors in the config's own terms), the CLI's bad-config exit, restart-mode sync."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from harnessrl.runtime.contracts.learner_config import LearnerConfig, load_config
from harnessrl.runtime.learner.main import main
from harnessrl.runtime.learner.sync import RestartSync
from pydantic import ValidationError


def base(**over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model": {"path": "/m", "served_name": "tiny"},
        "harnesses": [{"pool": "p", "harness": "mini-swe-agent", "weight": 2}],
        "tasks": {"ids": ["a", "b"]},
        "proxy": {"url": "http://proxy", "admin_token_file": "/t"},
        "engine": {"urls": ["http://e:8000/"]},
        "checkpoint": {"dir": "/ck"},
        "runner_token_file": "/r",
    }
    cfg.update(over)
    return cfg


def test_defaults_follow_the_architecture() -> None:
    cfg = LearnerConfig.model_validate(base())
    assert (cfg.reward.bonus, cfg.reward.scale, cfg.grpo.group_size) == (0.1, 15.0, 8)
    assert cfg.engine.urls == ["http://e:8000"]
    assert cfg.grpo.open_groups() == 2 * cfg.grpo.groups_per_step
    assert cfg.metrics_file() == Path("/ck/metrics.jsonl")


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"tasks": {"ids": ["a"], "file": "/x"}}, "exactly one of `ids` or `file`"),
        ({"harnesses": [{"pool": "p", "harness": "a"}, {"pool": "p", "harness": "b"}]}, "each pool may appear once"),
        ({"engine": {"urls": ["http://e"], "sync": "nccl"}}, "needs adapter.kind 'full'"),
        ({"adapter": {"kind": "full"}}, "engine.sync 'lora' needs adapter.kind 'lora'"),
        ({"export": {"repo": "a/b"}}, "exactly one of `token_file` or `token_env`"),
        ({"export": {"repo": "a/b", "token_env": "X", "token_file": "/f"}}, "exactly one of `token_file`"),
        ({"grpo": {"groups_per_step": 4, "max_open_groups": 2}}, "max_open_groups must be >= grpo.groups_per_step"),
        ({"surprise": 1}, "Extra inputs are not permitted"),
        ({"adapter": {"kind": "full"}, "engine": {"urls": ["http://e"], "sync": "nccl"}, "grpo": {"beta": 0.1}},
         "grpo.beta needs adapter.kind 'lora'"),
        ({"grpo": {"loss_type": "cispo"}}, "clip_high is CISPO's weight cap"),
        ({"grpo": {"vllm_importance_sampling_clip_max": None}}, "needs clip_min or clip_max"),
        ({"grpo": {"vllm_importance_sampling_clip_min": 4.0}}, "clip_min must be <= vllm_importance_sampling_clip_max"),
    ],
)
def test_bad_configs_say_what_is_wrong(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LearnerConfig.model_validate(base(**over))


def test_task_file_and_its_errors(tmp_path: Path) -> None:
    f = tmp_path / "train.txt"
    f.write_text("# split train\nt1\n\nt2\n")
    assert LearnerConfig.model_validate(base(tasks={"file": str(f)})).tasks.load() == ["t1", "t2"]
    f.write_text("t1\nt1\n")
    with pytest.raises(ValueError, match="duplicate task ids"):
        LearnerConfig.model_validate(base(tasks={"file": str(f)})).tasks.load()


def test_cli_rejects_a_bad_config_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "learner.yaml"
    path.write_text(yaml.safe_dump(base(grpo={"group_size": 1})))
    assert main(["--config", str(path)]) == 2
    assert "group_size" in capsys.readouterr().out
    path.write_text(yaml.safe_dump(base()))
    assert load_config(path).model.served_name == "tiny"


class _Saved:
    peft_config: ClassVar[dict[str, Any]] = {}  # looks like a PEFT model: publishes an adapter name

    def save_pretrained(self, path: Path) -> None:
        Path(path).mkdir(parents=True)
        (Path(path) / "adapter_model.safetensors").write_bytes(b"weights")


def test_restart_sync_writes_policy_and_marker(tmp_path: Path) -> None:
    sync = RestartSync("tiny", tmp_path)
    policy = sync.publish(_Saved(), 7)
    assert (policy.model, policy.version) == ("tiny-v7", 7)
    marker = json.loads((tmp_path / "policy.json").read_text())
    assert marker["version"] == 7 and marker["adapter"] is True
    assert (Path(marker["path"]) / "adapter_model.safetensors").read_bytes() == b"weights"
    assert not list(tmp_path.glob(".*tmp"))
