"""`harnessrl run` planning: the quickstart file becomes local processes, configs and secrets on disk."""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import re
import stat
import sys
import types
from pathlib import Path

import pytest
from harnessrl.runtime.engine.restart import PublishedPolicy, write_published

from harnessrl.local.run import (
    EngineRestarts,
    LocalRunError,
    learner_config,
    main,
    plan_run,
    process_specs,
    published_policy,
)
from harnessrl.local.supervisor import ProcessSpec, Supervisor

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart" / "trainingrun.yaml"


def args(tmp_path: Path, model_dir: Path, **overrides: object) -> argparse.Namespace:
    base = dict(
        files=[QUICKSTART],
        run_dir=tmp_path / "run",
        volume=[f"tiny-model={model_dir}", f"quickstart-tasks={ROOT / 'examples' / 'quickstart' / 'tasks'}"],
        secret=[],
        steps=None,
        seed=None,
    )
    return argparse.Namespace(**(base | overrides))


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    # Planning reads no weights; an existing directory stands for the volume.
    path = tmp_path / "model"
    path.mkdir()
    return path


def test_quickstart_plans_engine_proxy_learner_and_one_runner_per_pool(tmp_path: Path, model_dir: Path) -> None:
    plan, placement = plan_run(args(tmp_path, model_dir, steps=3, seed=7))
    run_dir = tmp_path / "run"
    specs = process_specs(plan, run_dir)
    assert [s.name for s in specs] == [
        "engine-0", "quickstart-proxy", "quickstart-learner", "quickstart-oneshot-runner",
    ]
    # Each component waits for the one before it; only the learner ends the run.
    assert [s.health_url is not None for s in specs] == [True, True, True, False]
    assert [s.finishes_run for s in specs] == [False, False, True, False]
    assert "vllm.entrypoints.openai.api_server" in specs[0].argv
    assert str(model_dir) in specs[0].argv

    learner = json.loads((run_dir / "config" / "quickstart-learner.json").read_text())
    assert learner["grpo"]["steps"] == 3  # --steps and --seed override the spec
    assert learner["grpo"]["seed"] == 7
    assert learner["host"] == "127.0.0.1"
    assert learner["engine"]["urls"] == [f"http://127.0.0.1:{placement.engine_ports[0]}"]
    # One machine: the engine loads adapters from the learner's own directory, no adapter store in between.
    assert plan.adapter_store is None and learner["engine"]["adapter_stores"] == []
    ids = (run_dir / "task-ids.txt").read_text().split()
    assert ids == [f"vowel-{i:02d}" for i in range(8)]  # the train split only

    admin, runner = run_dir / "secrets" / "proxy-admin-token", run_dir / "secrets" / "runner-token"
    for token in (admin, runner):
        assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text()) >= 32
        # The token is a file the components read; it is in no config.
        for config in (run_dir / "config").iterdir():
            assert token.read_text() not in config.read_text()
    assert admin.read_text() != runner.read_text()  # one credential per role
    # The learner checks the runner token and the runners send it: both read that one file.
    assert learner["runner_token_file"] == str(runner)
    runners = [json.loads(p.read_text()) for p in (run_dir / "config").glob("*-runner.json")]
    assert runners and all(r["runner_token_file"] == str(runner) for r in runners)
    assert (run_dir / "plan.json").exists()


def test_a_validation_split_is_listed_for_the_learner_apart_from_the_test_split(tmp_path: Path,
                                                                               model_dir: Path) -> None:
    from tests.fixtures.task_splits import split_held_out

    test, validation = split_held_out(ROOT / "examples" / "quickstart" / "tasks", tmp_path / "tasks")
    manifest = QUICKSTART.read_text().replace("    split: test\n", "    split: test\n    validationSplit: validation\n")
    assert "validationSplit" in manifest
    (tmp_path / "run.yaml").write_text(manifest)
    plan, _ = plan_run(args(tmp_path, model_dir, files=[tmp_path / "run.yaml"],
                                    volume=[f"tiny-model={model_dir}", f"quickstart-tasks={tmp_path / 'tasks'}"]))
    learner = learner_config(plan)
    assert learner.eval is not None and learner.eval.validation is not None
    assert learner.eval.task_ids() == test and learner.eval.validation_task_ids() == validation and validation


def test_admin_token_survives_a_second_plan_of_the_same_run_dir(tmp_path: Path, model_dir: Path) -> None:
    plan_run(args(tmp_path, model_dir))
    secrets = tmp_path / "run" / "secrets"
    first = {name: (secrets / name).read_text() for name in ("proxy-admin-token", "runner-token")}
    plan_run(args(tmp_path, model_dir))
    assert {name: (secrets / name).read_text() for name in first} == first


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


class RecordingSupervisor(Supervisor):
    """Records planned restarts instead of starting vLLM (which takes tens of seconds a start here)."""

    def __init__(self) -> None:
        super().__init__()
        self.replaced: list[ProcessSpec] = []

    def replace(self, name: str, spec: ProcessSpec, grace_s: float = 15.0) -> None:
        assert spec.name == name
        self.replaced.append(spec)


def test_weight_sync_restart_starts_and_restarts_the_engines_on_the_published_policy(
    tmp_path: Path, model_dir: Path
) -> None:
    text = QUICKSTART.read_text().replace("weightSync: lora", "weightSync: restart")
    assert "weightSync: restart" in text
    (tmp_path / "restart.yaml").write_text(text)
    plan, _ = plan_run(args(tmp_path, model_dir, files=[tmp_path / "restart.yaml"]))
    run_dir = tmp_path / "run"
    assert published_policy(plan) is None  # nothing published yet: the engine starts on the base model
    assert "--lora-modules" not in process_specs(plan, run_dir)[0].argv
    sync = run_dir / "checkpoints" / "sync"
    sync.mkdir(parents=True)

    def publish(version: int) -> PublishedPolicy:
        policy = PublishedPolicy(version=version, model=f"policy-v{version}", path=str(sync / f"policy-v{version}"),
                                 adapter=True, written_at=float(version))
        write_published(sync, policy)
        return policy

    # A resumed run starts its engine on what the learner last published.
    served = publish(2)
    assert published_policy(plan) == served
    argv = process_specs(plan, run_dir, served)[0].argv
    assert argv[argv.index("--lora-modules") + 1] == f"policy-v2={sync / 'policy-v2'}"

    supervisor = RecordingSupervisor()
    restarts = EngineRestarts(plan, run_dir, supervisor, served)
    restarts.poll()
    assert supervisor.replaced == []  # already served
    publish(3)
    restarts.poll()
    restarts.poll()  # once per new version
    assert [s.name for s in supervisor.replaced] == ["engine-0"]
    argv = supervisor.replaced[0].argv
    assert argv[argv.index("--lora-modules") + 1] == f"policy-v3={sync / 'policy-v3'}"
    assert supervisor.replaced[0].health_url is not None  # the run waits for it as for the first start


def test_weight_sync_lora_reads_no_published_policy(tmp_path: Path, model_dir: Path) -> None:
    plan, _ = plan_run(args(tmp_path, model_dir))
    sync = tmp_path / "run" / "checkpoints" / "sync"
    sync.mkdir(parents=True)
    write_published(sync, PublishedPolicy(version=1, model="policy-v1", path="/x", adapter=True, written_at=0.0))
    assert published_policy(plan) is None  # LoRA sync hot-loads; the learner restores a restarted engine


def test_proxy_workers_run_locally_at_free_ports_after_the_proxys(tmp_path: Path, model_dir: Path) -> None:
    import socket

    import yaml

    docs = list(yaml.safe_load_all(QUICKSTART.read_text()))
    run = next(d for d in docs if d["kind"] == "TrainingRun")
    run["spec"].setdefault("proxy", {})["workers"] = 2
    (tmp_path / "workers.yaml").write_text(yaml.safe_dump_all(docs))
    plan, _ = plan_run(args(tmp_path, model_dir, files=[tmp_path / "workers.yaml"]))
    [proxy] = [s for s in process_specs(plan, tmp_path / "run") if s.name == "quickstart-proxy"]
    config = json.loads((tmp_path / "run" / "config" / "quickstart-proxy.json").read_text())
    assert config["workers"] == 2 and proxy.health_url == f"http://127.0.0.1:{config['port']}/healthz"
    for port in (config["port"] + 1, config["port"] + 2):  # the workers' own ports are free too
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def tracked(tmp_path: Path, tracking: dict[str, object]) -> Path:
    """The quickstart with `spec.tracking` set."""
    import yaml

    docs = list(yaml.safe_load_all(QUICKSTART.read_text()))
    next(d for d in docs if d["kind"] == "TrainingRun")["spec"]["tracking"] = tracking
    path = tmp_path / "tracked.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def installed(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Stand-ins for tracker packages, importable as if installed."""
    for name in modules:
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)


def test_the_learner_writes_tensorboard_event_files_into_the_run_dir(tmp_path: Path, model_dir: Path) -> None:
    plan, _ = plan_run(args(tmp_path, model_dir))
    learner = learner_config(plan)
    assert learner.tracking.report_to == ["tensorboard"]  # the default, with nothing to install
    assert learner.tracking_dir() == tmp_path / "run" / "checkpoints" / "tracking"


def test_a_tracker_not_installed_is_refused_before_anything_starts(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as when not installed
    monkeypatch.setitem(sys.modules, "mlflow", None)
    files = [tracked(tmp_path, {"reportTo": ["wandb", "mlflow"], "wandb": {"apiKeySecret": {"name": "wandb"}},
                                "mlflow": {"trackingUriSecret": {"name": "mlflow"}}})]
    with pytest.raises(LocalRunError, match=re.escape("spec.tracking.reportTo lists wandb, mlflow, not installed "
                                                      "here: pip install wandb mlflow")):
        plan_run(args(tmp_path, model_dir, files=files))
    assert not (tmp_path / "run").exists()  # refused before the run directory or a download


def test_tracker_credentials_come_from_secret_flags_into_files_no_config_holds(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed(monkeypatch, "wandb", "mlflow")
    files = [tracked(tmp_path, {
        "reportTo": ["tensorboard", "wandb", "mlflow"],
        "wandb": {"apiKeySecret": {"name": "wandb"}},
        # One Secret, two keys: `--secret NAME/KEY=FILE` gives each.
        "mlflow": {"trackingUriSecret": {"name": "mlflow", "key": "uri"}, "tokenSecret": {"name": "mlflow"}},
        "viewerUrl": "http://127.0.0.1:8765",
    })]
    given = {"wandb": "wandb-key-0123456789", "mlflow/uri": "https://user:pw@mlflow.example", "mlflow/token": "tok-42"}
    for name, value in given.items():
        (tmp_path / name.replace("/", "-")).write_text(value + "\n")
    secret = [f"{name}={tmp_path / name.replace('/', '-')}" for name in given]
    with pytest.raises(LocalRunError, match="pass --secret wandb=FILE"):
        plan_run(args(tmp_path, model_dir, files=files, secret=secret[1:]))
    plan, _ = plan_run(args(tmp_path, model_dir, files=files, secret=secret))
    tracking = learner_config(plan).tracking
    assert tracking.wandb is not None and tracking.mlflow is not None and tracking.mlflow.token_file is not None
    assert tracking.viewer_url == "http://127.0.0.1:8765"  # where the rollout samples link
    run_dir = tmp_path / "run"
    for path, value in ((tracking.wandb.api_key_file, given["wandb"]), (tracking.mlflow.tracking_uri_file,
                        given["mlflow/uri"]), (tracking.mlflow.token_file, given["mlflow/token"])):
        assert path.parent == run_dir / "secrets" and path.read_text() == value
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    process_specs(plan, run_dir)
    for config in (run_dir / "config").iterdir():
        assert not any(value in config.read_text() for value in given.values())


def test_an_engine_variable_from_a_secret_reaches_only_the_engines_environment(tmp_path: Path, model_dir: Path) -> None:
    import yaml

    docs = list(yaml.safe_load_all(QUICKSTART.read_text()))
    run = next(d for d in docs if d["kind"] == "TrainingRun")
    run["spec"].setdefault("engine", {})["env"] = [
        {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}},
        {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"},
    ]
    path = tmp_path / "run-with-env.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    with pytest.raises(LocalRunError, match=r"Secret 's3' \(key 'secret'\); pass --secret s3=FILE"):
        plan_run(args(tmp_path, model_dir, files=[path]))
    (tmp_path / "s3-secret").write_text("wJalrXUtnFEMI/K7MDENG")
    plan, _ = plan_run(args(tmp_path, model_dir, files=[path], secret=[f"s3/secret={tmp_path / 's3-secret'}"]))
    run_dir = tmp_path / "run"
    specs = {s.name: s for s in process_specs(plan, run_dir)}
    engine = specs["engine-0"]
    assert engine.env["AWS_SECRET_ACCESS_KEY"] == "wJalrXUtnFEMI/K7MDENG" and engine.env["VLLM_LOGGING_LEVEL"] == "INFO"
    assert not any("AWS_SECRET_ACCESS_KEY" in s.env for name, s in specs.items() if name != "engine-0")
    for config in (run_dir / "config").iterdir():
        assert "wJalrXUtnFEMI" not in config.read_text()


def test_the_gpus_here_are_counted_as_cuda_would_see_them(tmp_path: Path) -> None:
    from harnessrl.local.gpus import gpu_ids

    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-caps"):
        (tmp_path / name).touch()
    assert len(gpu_ids({}, tmp_path)) == 2  # device files, not the control nodes
    assert len(gpu_ids({"CUDA_VISIBLE_DEVICES": "0"}, tmp_path)) == 1
    assert len(gpu_ids({"CUDA_VISIBLE_DEVICES": ""}, tmp_path)) == 0
    assert len(gpu_ids({"CUDA_VISIBLE_DEVICES": "1,0,-1,2"}, tmp_path)) == 2  # CUDA stops at the first invalid one
    assert len(gpu_ids({"CUDA_VISIBLE_DEVICES": "GPU-8a1b2c3d-0000-1111-2222-333344445555"}, tmp_path)) == 1
