"""The release workflow cannot run here (it pushes to ghcr.io): it is checked against GitHub's workflow schema
(as vendored by check-jsonschema) and against the Makefile it drives."""

from __future__ import annotations

import importlib.resources
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def schema() -> dict[str, object]:
    vendored = importlib.resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "github-workflows.json"
    return json.loads(vendored.read_text())  # type: ignore[no-any-return]


def load_workflow() -> dict[object, object]:
    """As GitHub reads it: YAML 1.2, where the key `on` is a string (PyYAML's YAML 1.1 makes it True)."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    workflow["on"] = workflow.pop(True)
    return workflow  # type: ignore[no-any-return]


def test_the_release_workflow_is_a_valid_github_workflow() -> None:
    workflow = load_workflow()
    errors = sorted(jsonschema.Draft7Validator(schema()).iter_errors(workflow), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_a_tag_builds_and_pushes_every_image_through_make() -> None:
    workflow: dict[str, Any] = load_workflow()  # type: ignore[assignment]
    assert workflow["on"]["push"]["tags"] == ["v*"]
    assert workflow["permissions"]["packages"] == "write"
    runs = [step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]]
    builds = [r for r in runs if r.startswith("make images ")]
    assert any("ACCEL=gpu" in r and "PUSH=1" in r for r in builds)
    assert any("ACCEL=cpu" in r and "PUSH=1" in r for r in builds)
    assert any(r.startswith("make images-check ") for r in runs)
    # Every variable the workflow sets for make is one the Makefile reads.
    makefile = (ROOT / "Makefile").read_text()
    for name in set(re.findall(r"\b([A-Z]+)=", " ".join(builds))) | set(workflow["jobs"]["images"]["env"]):
        assert re.search(rf"^{name} \?=", makefile, flags=re.MULTILINE), name
