"""`harnessrl run` on a GPU machine, checked on the plan (no GPU here): each engine replica and the learner see
GPUs of their own through CUDA_VISIBLE_DEVICES, a learner of several GPUs runs under `harnessrl torchrun`, and
a run that needs more GPUs than the machine has is refused before anything starts. Before, every process saw
every GPU and took cuda:0, and `learner.gpus: 2` ran one process."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from harnessrl.runtime.programs import BOOTSTRAP

from harnessrl.local import gpus
from harnessrl.local.run import main, plan_run, process_specs
from tests.unit.test_local_plan import QUICKSTART, args


def quickstart_on_gpus(tmp_path: Path, model_dir: Path, engine: dict[str, Any], learner: dict[str, Any]) -> argparse.Namespace:
    docs = list(yaml.safe_load_all(QUICKSTART.read_text()))
    for doc in docs:
        if doc["kind"] == "TrainingRun":
            doc["spec"]["engine"] |= engine
            doc["spec"]["learner"] |= learner
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return args(tmp_path, model_dir, files=[path])


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    return path


def test_each_engine_and_the_learner_get_gpus_of_their_own(tmp_path: Path, model_dir: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gpus.CUDA_VISIBLE_DEVICES, "0,1,2,3,4")  # what the machine gives this run
    plan, _ = plan_run(quickstart_on_gpus(tmp_path, model_dir, {"gpus": 1, "replicas": 2}, {"gpus": 2}))
    specs = {s.name: s for s in process_specs(plan, tmp_path / "run")}
    seen = {name: s.env.get(gpus.CUDA_VISIBLE_DEVICES) for name, s in specs.items()}
    assert seen == {"engine-0": "0", "engine-1": "1", "quickstart-learner": "2,3",
                    "quickstart-proxy": None, "quickstart-oneshot-runner": None}
    learner = specs["quickstart-learner"].argv
    assert learner[3:7] == ["harnessrl.cli", "torchrun", "--standalone", "--nproc-per-node=2"]
    # torchrun starts each worker by the same bootstrap under this interpreter (runtime/programs.py).
    assert learner[7:12] == ["--no-python", sys.executable, "-c", BOOTSTRAP, "harnessrl.cli"] and learner[12] == "learner"
    # One GPU: the learner itself, no torchrun.
    plan, _ = plan_run(quickstart_on_gpus(tmp_path, model_dir, {"gpus": 2}, {"gpus": 1}))
    specs = {s.name: s for s in process_specs(plan, tmp_path / "run")}
    assert specs["engine-0"].env[gpus.CUDA_VISIBLE_DEVICES] == "0,1"
    assert specs["quickstart-learner"].env[gpus.CUDA_VISIBLE_DEVICES] == "2"
    assert "torchrun" not in specs["quickstart-learner"].argv


def test_a_run_needing_more_gpus_than_the_machine_has_is_refused(tmp_path: Path, model_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(gpus.CUDA_VISIBLE_DEVICES, "0,1")
    a = quickstart_on_gpus(tmp_path, model_dir, {"gpus": 1, "replicas": 2}, {"gpus": 1})
    argv = [str(f) for f in a.files] + ["--run-dir", str(a.run_dir), *[f"--volume={v}" for v in a.volume]]
    assert main(argv) == 2
    assert "spec.learner.gpus 1 and spec.engine.gpus 1 x 2 replica(s) need 3 GPU(s); this machine has 2" in (
        capsys.readouterr().err)


def test_cpu_processes_see_no_gpu(tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gpus.CUDA_VISIBLE_DEVICES, "0")
    plan, _ = plan_run(args(tmp_path, model_dir))  # the quickstart: engine and learner on CPU
    specs = {s.name: s for s in process_specs(plan, tmp_path / "run")}
    assert specs["engine-0"].env[gpus.CUDA_VISIBLE_DEVICES] == ""
    assert specs["quickstart-learner"].env[gpus.CUDA_VISIBLE_DEVICES] == ""
