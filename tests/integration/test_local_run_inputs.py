"""`harnessrl run` on a spec naming something it cannot get ends with one line per problem saying what and how
to provide it, never a traceback: a Hub model with no network or no token, a volume, a Secret, a pool, GPUs or
bubblewrap it was not given. Everything it can check is checked before any download or start. The real CLI, as a
subprocess, against a closed port and the local Hub stand-in (tests/fixtures/hub_server.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HARNESSRL = Path(sys.executable).parent / "harnessrl"
pytestmark = pytest.mark.timeout(120)


QUICKSTART = ROOT / "examples" / "quickstart" / "trainingrun.yaml"
QUICKSTART_VOLUMES = ("--volume", f"quickstart-tasks={ROOT / 'examples' / 'quickstart' / 'tasks'}")


def run_cli(tmp_path: Path, endpoint: str, *args: str, **env_overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env |= env_overrides
    return subprocess.run([str(HARNESSRL), "run", "--run-dir", str(tmp_path / "run"), *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=90)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def quickstart(tmp_path: Path, base: dict[str, object] | None = None, **spec: object) -> Path:
    """The quickstart's file (its pools and run) with the run's model.base and further spec fields replaced."""
    docs = list(yaml.safe_load_all(QUICKSTART.read_text()))
    run = next(d for d in docs if d["kind"] == "TrainingRun")
    if base is not None:
        run["spec"]["model"]["base"] = base
    run["spec"] |= spec
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


HUB_MODEL = {"hub": {"repo": "Qwen/Qwen3-8B"}}


def test_a_hub_model_with_no_network_is_one_line(tmp_path: Path) -> None:
    done = run_cli(tmp_path, f"http://127.0.0.1:{closed_port()}", str(quickstart(tmp_path, HUB_MODEL)), *QUICKSTART_VOLUMES)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("harnessrl run: spec.model.base: the model Qwen/Qwen3-8B@main on http://127.0.0.1:")
    assert "cannot be downloaded (no network?) and is not in the Hugging Face cache" in line
    assert "hf download Qwen/Qwen3-8B" in line and "--volume CLAIM=DIR" in line


def test_a_hub_model_without_a_token_is_one_line(tmp_path: Path, hub_server: object) -> None:
    done = run_cli(tmp_path, hub_server.endpoint, str(quickstart(tmp_path, HUB_MODEL)), *QUICKSTART_VOLUMES)  # type: ignore[attr-defined]
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "spec.model.base: the model Qwen/Qwen3-8B@main" in line
    assert "needs a token that can read it: name a Secret in spec.model.base.hub.tokenSecret and pass --secret" in line


def test_a_gated_hub_model_is_read_with_the_token_its_spec_names(tmp_path: Path, hub_server: object) -> None:
    """model.base.hub.tokenSecret: `harnessrl run` reads the token from the --secret file, not from HF_TOKEN."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_server.endpoint, token=hub_server.token)  # type: ignore[attr-defined]
    api.create_repo("org/gated-model")
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "config.json").write_text("{}")
    api.upload_folder(repo_id="org/gated-model", folder_path=tmp_path / "weights")
    # The task dataset does not exist: the run stops right after the model's download.
    spec = quickstart(tmp_path, {"hub": {"repo": "org/gated-model", "tokenSecret": {"name": "hf-read", "key": "token"}}},
                      tasks={"hub": {"repo": "org/no-such-tasks"}, "split": "train"})
    asked = run_cli(tmp_path, hub_server.endpoint, str(spec))  # type: ignore[attr-defined]
    assert asked.returncode == 2 and asked.stderr.strip() == (
        "harnessrl run: the run needs Secret 'hf-read' (key 'token'); pass --secret hf-read=FILE")
    assert not (tmp_path / "hf" / "hub" / "models--org--gated-model").exists()  # asked before the download
    (tmp_path / "token").write_text(hub_server.token + "\n")  # type: ignore[attr-defined]
    done = run_cli(tmp_path, hub_server.endpoint, str(spec), "--secret", f"hf-read={tmp_path / 'token'}")  # type: ignore[attr-defined]
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("harnessrl run: spec.tasks: the dataset org/no-such-tasks")
    assert (tmp_path / "hf" / "hub" / "models--org--gated-model").is_dir()  # downloaded with the token
    assert hub_server.token not in done.stdout + done.stderr  # type: ignore[attr-defined]


def test_a_volume_it_was_not_given_is_one_line(tmp_path: Path) -> None:
    spec = quickstart(tmp_path, {"pvc": {"claimName": "weights"}})
    done = run_cli(tmp_path, f"http://127.0.0.1:{closed_port()}", str(spec), *QUICKSTART_VOLUMES)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("harnessrl run: spec.model.base reads PersistentVolumeClaim 'weights'; pass "
                                   "--volume weights=DIR to say where its files are on this machine")


def test_every_problem_is_said_at_once_before_any_download_or_start(tmp_path: Path) -> None:
    """A Hub model (which would be downloaded first), a volume not given, GPUs this machine lacks and a pool no
    file defines: all said in one go; with the pool there, the Secret not given. Nothing downloaded or started."""
    spec = quickstart(
        tmp_path, HUB_MODEL,
        harnesses=[{"pool": "oneshot"}, {"pool": "codex"}],
        learner={"gpus": 1, "gpuMemoryGib": 80},
        engine={"gpus": 0, "weightSync": "lora",
                "env": [{"name": "S3_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "key"}}}]},
    )
    done = run_cli(tmp_path, f"http://127.0.0.1:{closed_port()}", str(spec), CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "harnessrl run: spec.tasks reads PersistentVolumeClaim 'quickstart-tasks'; pass --volume quickstart-tasks=DIR "
        "to say where its files are on this machine",
        "harnessrl run: spec.learner.gpus 1 and spec.engine.gpus 0 x 1 replica(s) need 1 GPU(s); this machine has 0 "
        "(CUDA_VISIBLE_DEVICES, else /dev/nvidiaN): set them to 0 to run on the CPU",
        "harnessrl run: the run names HarnessPool codex, defined in none of the files given: add the file(s) that "
        "define them",
    ]
    # The pool fixed, the Secret is next.
    spec = quickstart(tmp_path, HUB_MODEL, engine={
        "gpus": 0, "weightSync": "lora",
        "env": [{"name": "S3_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "key"}}}]})
    done = run_cli(tmp_path, f"http://127.0.0.1:{closed_port()}", str(spec), *QUICKSTART_VOLUMES)
    assert done.stderr.strip().splitlines() == [
        "harnessrl run: the run needs Secret 's3' (key 'key'); pass --secret s3=FILE"]
    assert not (tmp_path / "hf" / "hub").exists()  # no download was tried
    run_dir = tmp_path / "run"
    assert not (run_dir / "logs").exists() and not (run_dir / "pids.json").exists()  # nothing started


def test_a_machine_without_bubblewrap_is_told_before_anything_starts(tmp_path: Path) -> None:
    """`make demo` on a fresh machine stopped after three minutes: the runner found no bubblewrap. Now the run
    refuses at once, naming the package and the pool."""
    bare = tmp_path / "bin"  # a PATH with no bwrap on it
    bare.mkdir()
    model = tmp_path / "model"
    model.mkdir()
    done = run_cli(tmp_path, f"http://127.0.0.1:{closed_port()}", str(QUICKSTART), *QUICKSTART_VOLUMES,
                   "--volume", f"tiny-model={model}", PATH=str(bare))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "harnessrl run: HarnessPool oneshot: the local sandbox cannot isolate rollouts here: 'bwrap' (bubblewrap) is "
        "not installed: apt-get install bubblewrap (or set sandbox.local.allowUnisolated: true)"]
    assert not (tmp_path / "run" / "logs").exists()
