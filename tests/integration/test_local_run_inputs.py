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
    assert "needs a token that can read it: set HF_TOKEN" in line


def test_a_volume_it_was_not_given_is_one_line(tmp_path: Path) -> None:
    manifest = yaml.safe_load((ROOT / "examples" / "trainingrun.yaml").read_text())
    manifest["spec"]["model"]["base"] = {"pvc": {"claimName": "weights"}}
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(manifest))
    done = run_cli(tmp_path, f"http://127.0.0.1:{closed_port()}", str(spec))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("harnessrl run: spec.model.base reads PersistentVolumeClaim 'weights'; pass "
                                   "--volume weights=DIR to say where its files are on this machine")
