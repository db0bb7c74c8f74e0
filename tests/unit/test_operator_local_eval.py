"""`harnessrl run` with spec.eval: the plan's eval-only pools become runner processes with no change to the local
runner, and the eval split's task ids are written where the learner's eval schedule reads them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml
from harnessrl.runtime.harness.tasks import load_dir, split_tasks

from harnessrl.local.run import plan_run, process_specs

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart" / "trainingrun.yaml"
TASKS = ROOT / "examples" / "quickstart" / "tasks"


def test_eval_only_pool_runs_locally_and_the_learner_gets_the_eval_split(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all(QUICKSTART.read_text()))
    run = next(d for d in docs if d["kind"] == "TrainingRun")
    # Train on oneshot only; evaluate under oneshot and mini-swe-agent (an eval-only pool).
    run["spec"]["harnesses"] = [{"pool": "oneshot"}]
    run["spec"]["eval"] = {"everySteps": 5, "split": "test", "harnesses": ["oneshot", "mini-swe-agent"], "limit": 3}
    files = tmp_path / "run.yaml"
    files.write_text(yaml.safe_dump_all(docs))
    model = tmp_path / "model"
    model.mkdir()  # planning reads no weights
    args = argparse.Namespace(files=[files], run_dir=tmp_path / "run", secret=[], steps=None, seed=None,
                              volume=[f"tiny-model={model}", f"quickstart-tasks={TASKS}"])
    plan, _ = plan_run(args)
    run_dir = tmp_path / "run"
    names = [s.name for s in process_specs(plan, run_dir)]
    assert names[-2:] == ["quickstart-oneshot-runner", "quickstart-mini-swe-agent-runner"]
    learner = json.loads((run_dir / "config" / "quickstart-learner.json").read_text())
    assert [h["pool"] for h in learner["harnesses"]] == ["oneshot"]
    assert [p["pool"] for p in learner["eval"]["pools"]] == ["oneshot", "mini-swe-agent"]
    assert learner["eval"]["every_steps"] == 5 and learner["eval"]["limit"] == 3
    # The whole test split is written; the learner takes the first `limit` of it, sorted.
    held_out = sorted(split_tasks(load_dir(TASKS), "test"))
    assert Path(learner["eval"]["tasks"]["file"]) == run_dir / "eval-ids.txt"
    assert (run_dir / "eval-ids.txt").read_text().split() == held_out and len(held_out) > 3
    assert (run_dir / "task-ids.txt").read_text().split() == sorted(split_tasks(load_dir(TASKS), "train"))
