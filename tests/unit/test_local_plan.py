"""`harnessrl run` planning: the quickstart file becomes local processes, configs and secrets on disk."""

from __future__ import annotations

import argparse
import json
import stat
from pathlib import Path

import pytest
from harnessrl.operator.local import LocalRunError, main, plan_run, process_specs

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart" / "trainingrun.yaml"


def args(tmp_path: Path, model_dir: Path, **overrides: object) -> argparse.Namespace:
    base = dict(
        files=[QUICKSTART],
        run_dir=tmp_path / "run",
        volume=[f"tiny-model={model_dir}", f"quickstart-tasks={ROOT / 'examples' / 'quickstart' / 'tasks'}"],
        secret=[],
        steps=None,
    )
    return argparse.Namespace(**(base | overrides))


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    # Planning reads no weights; an existing directory stands for the volume.
    path = tmp_path / "model"
    path.mkdir()
    return path


def test_quickstart_plans_engine_proxy_learner_and_one_runner_per_pool(tmp_path: Path, model_dir: Path) -> None:
    plan, placement = plan_run(args(tmp_path, model_dir, steps=3))
    run_dir = tmp_path / "run"
    specs = process_specs(plan, run_dir)
    assert [s.name for s in specs] == [
        "engine-0", "quickstart-proxy", "quickstart-learner", "quickstart-oneshot-runner",
        "quickstart-mini-swe-agent-runner",
    ]
    # Each component waits for the one before it; only the learner ends the run.
    assert [s.health_url is not None for s in specs] == [True, True, True, False, False]
    assert [s.finishes_run for s in specs] == [False, False, True, False, False]
    assert "vllm.entrypoints.openai.api_server" in specs[0].argv
    assert str(model_dir) in specs[0].argv

    learner = json.loads((run_dir / "config" / "quickstart-learner.json").read_text())
    assert learner["grpo"]["steps"] == 3  # --steps overrides the spec
    assert learner["host"] == "127.0.0.1"
    assert learner["engine"]["urls"] == [f"http://127.0.0.1:{placement.engine_ports[0]}"]
    ids = (run_dir / "task-ids.txt").read_text().split()
    assert ids == [f"vowel-{i:02d}" for i in range(8)]  # the train split only

    token = run_dir / "secrets" / "proxy-admin-token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text()) >= 32
    # The token is a file the components read; it is in no config.
    for config in (run_dir / "config").iterdir():
        assert token.read_text() not in config.read_text()
    assert (run_dir / "plan.json").exists()


def test_admin_token_survives_a_second_plan_of_the_same_run_dir(tmp_path: Path, model_dir: Path) -> None:
    plan_run(args(tmp_path, model_dir))
    first = (tmp_path / "run" / "secrets" / "proxy-admin-token").read_text()
    plan_run(args(tmp_path, model_dir))
    assert (tmp_path / "run" / "secrets" / "proxy-admin-token").read_text() == first


def test_missing_volume_says_which_flag_to_pass(tmp_path: Path, model_dir: Path) -> None:
    with pytest.raises(LocalRunError, match="pass --volume quickstart-tasks=DIR"):
        plan_run(args(tmp_path, model_dir, volume=[f"tiny-model={model_dir}"]))


def test_bad_inputs_exit_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool_only = tmp_path / "pool.yaml"
    pool_only.write_text("\n".join(QUICKSTART.read_text().split("---")[0:1]))
    assert main([str(pool_only), "--run-dir", str(tmp_path / "r")]) == 2
    assert "expected exactly one TrainingRun" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
