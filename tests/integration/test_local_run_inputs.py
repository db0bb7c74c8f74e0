"""`harnessrl run` on a spec naming something it cannot get ends with one line saying what and how to provide
it, never a traceback: a Hub model with no network or no token, a volume it was not given. The real CLI, as a
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


def run_cli(tmp_path: Path, endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    return subprocess.run([str(HARNESSRL), "run", "--run-dir", str(tmp_path / "run"), *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=90)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_hub_model_with_no_network_is_one_line(tmp_path: Path) -> None:
    done = run_cli(tmp_path, f"http://127.0.0.1:{closed_port()}", str(ROOT / "examples" / "trainingrun.yaml"))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("harnessrl run: spec.model.base: the model Qwen/Qwen3-8B@main on http://127.0.0.1:")
    assert "cannot be downloaded (no network?) and is not in the Hugging Face cache" in line
    assert "hf download Qwen/Qwen3-8B" in line and "--volume CLAIM=DIR" in line


def test_a_hub_model_without_a_token_is_one_line(tmp_path: Path, hub_server: object) -> None:
    done = run_cli(tmp_path, hub_server.endpoint, str(ROOT / "examples" / "trainingrun.yaml"))  # type: ignore[attr-defined]
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
    manifest = yaml.safe_load((ROOT / "examples" / "trainingrun.yaml").read_text())
    manifest["spec"]["model"]["base"] = {"hub": {"repo": "org/gated-model", "tokenSecret": {"name": "hf-read", "key": "token"}}}
    manifest["spec"]["tasks"] = {"pvc": {"claimName": "tasks"}}  # not given: the run stops right after the download
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(manifest))
    asked = run_cli(tmp_path, hub_server.endpoint, str(spec))  # type: ignore[attr-defined]
    assert asked.returncode == 2 and asked.stderr.strip() == (
        "harnessrl run: the run needs Secret 'hf-read' (key 'token'); pass --secret hf-read=FILE")
    (tmp_path / "token").write_text(hub_server.token + "\n")  # type: ignore[attr-defined]
    done = run_cli(tmp_path, hub_server.endpoint, str(spec), "--secret", f"hf-read={tmp_path / 'token'}")  # type: ignore[attr-defined]
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("harnessrl run: spec.tasks reads PersistentVolumeClaim 'tasks'")
    assert (tmp_path / "hf" / "hub" / "models--org--gated-model").is_dir()  # downloaded with the token
    assert hub_server.token not in done.stdout + done.stderr  # type: ignore[attr-defined]


def test_a_volume_it_was_not_given_is_one_line(tmp_path: Path) -> None:
    manifest = yaml.safe_load((ROOT / "examples" / "trainingrun.yaml").read_text())
    manifest["spec"]["model"]["base"] = {"pvc": {"claimName": "weights"}}
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(manifest))
    done = run_cli(tmp_path, f"http://127.0.0.1:{closed_port()}", str(spec))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("harnessrl run: spec.model.base reads PersistentVolumeClaim 'weights'; pass "
                                   "--volume weights=DIR to say where its files are on this machine")
