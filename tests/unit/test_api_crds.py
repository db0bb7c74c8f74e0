"""`harnessrl crds`: the committed CRDs and reference are in sync, structural, bounded and strictly valid;
the examples agree with the models."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cel
import pytest
import yaml
from harnessrl.operator.api import HarnessPool, ManifestError, load_manifest
from harnessrl.operator.api.crdgen import main as crds_main
from harnessrl.operator.api.crds import all_crds
from harnessrl.operator.api.structural import structural_errors

from harnessrl.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"
REFERENCE = ROOT / "operator" / "api" / "README.md"
VALID = [ROOT / "examples" / "trainingrun.yaml", *sorted((ROOT / "examples" / "harnesspools").glob("*.yaml"))]
INVALID = sorted((ROOT / "examples" / "invalid").glob("*.yaml"))


@pytest.fixture(scope="module")
def crds() -> dict[str, dict[str, Any]]:
    return {path.name: yaml.safe_load(path.read_text()) for path in sorted(CRD_DIR.glob("*.yaml"))}


def schema_of(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from nodes(node["additionalProperties"], f"{path}{{}}")


def test_generator_reproduces_the_committed_files_byte_for_byte(tmp_path: Path) -> None:
    assert cli(["crds", "--out", str(tmp_path), "--reference", str(tmp_path / "README.md")]) == 0
    generated = sorted(p.name for p in tmp_path.glob("*.yaml"))
    assert generated == sorted(p.name for p in CRD_DIR.glob("*.yaml")) == [
        "enginepools.harnessrl.io.yaml", "harnesspools.harnessrl.io.yaml", "trainingruns.harnessrl.io.yaml"]  # fmt: skip
    for name in generated:
        assert (tmp_path / name).read_bytes() == (CRD_DIR / name).read_bytes(), f"crds/{name} is stale"
    assert (tmp_path / "README.md").read_bytes() == REFERENCE.read_bytes(), "operator/api/README.md is stale"


def test_check_mode_passes_on_the_repo_and_fails_on_a_stale_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert crds_main(["--check", "--out", str(CRD_DIR), "--reference", str(REFERENCE)]) == 0
    stale = tmp_path / "crds"
    shutil.copytree(CRD_DIR, stale)
    target = stale / "harnesspools.harnessrl.io.yaml"
    target.write_text(target.read_text().replace("default: 8\n", "default: 9\n", 1))
    capsys.readouterr()
    assert crds_main(["--check", "--out", str(stale)]) == 1
    out = capsys.readouterr().out
    assert "-                default: 9" in out and "+                default: 8" in out
    assert "1 file(s) out of date" in out
    assert target.read_text().count("default: 9") == 1  # --check writes nothing


def test_crds_are_structural_and_bounded(crds: dict[str, dict[str, Any]]) -> None:
    for name, crd in crds.items():
        assert structural_errors(schema_of(crd)) == [], name


@pytest.mark.parametrize(
    ("break_it", "problem"),
    [
        (lambda s: s["properties"]["spec"].pop("type"), "<root>.spec: has no type"),
        (lambda s: s["properties"]["spec"]["properties"].update(x={"$ref": "#/definitions/X", "description": "d"}),
         "<root>.spec.x: keyword '$ref' is not allowed"),
        (lambda s: s["properties"]["spec"]["properties"].update(x={"type": "string", "description": "d"}),
         "<root>.spec.x: string without maxLength"),
        (lambda s: s["properties"]["spec"]["properties"].update(x={"type": "string", "maxLength": 1}),
         "<root>.spec.x: has no description"),
        (lambda s: s["properties"]["spec"]["properties"].update(
            x={"type": "array", "description": "d", "items": {"type": "integer"}}), "<root>.spec.x: list without maxItems"),
        (lambda s: s["properties"]["spec"]["properties"].update(
            x={"type": "object", "description": "d", "additionalProperties": {"type": "boolean"}}),
         "<root>.spec.x: map without maxProperties"),
        (lambda s: s["properties"]["spec"]["properties"].update(
            x={"description": "d", "anyOf": [{"type": "integer"}, {"type": "boolean"}]}), "<root>.spec.x: has no type"),
        (lambda s: s["properties"]["spec"]["properties"].update(
            x={"type": "integer", "description": "d", "anyOf": [{"type": "integer", "minimum": 1}]}),
         "<root>.spec.x: anyOf may not set 'type'"),
        (lambda s: s["properties"]["spec"].update(additionalProperties={"type": "integer"}),
         "<root>.spec: has both properties and additionalProperties"),
        (lambda s: s["properties"]["metadata"].update(description="m"),
         "<root>.metadata: may only restrict name and generateName"),
        (lambda s: s["properties"]["spec"]["properties"].update(
            x={"type": "array", "description": "d", "maxItems": 2, "uniqueItems": True, "items": {"type": "integer"}}),
         "<root>.spec.x: uniqueItems: true is not allowed"),
    ],
)  # fmt: skip
def test_structural_checker_catches_each_violation(
    crds: dict[str, dict[str, Any]], break_it: Any, problem: str
) -> None:
    schema = copy.deepcopy(schema_of(crds["trainingruns.harnessrl.io.yaml"]))
    break_it(schema)
    assert any(error.startswith(problem) for error in structural_errors(schema)), structural_errors(schema)


def test_property_names_are_camel_case(crds: dict[str, dict[str, Any]]) -> None:
    for crd in crds.values():
        for path, node in nodes(schema_of(crd)):
            for name in node.get("properties", {}):
                # lowerCamelCase; a digit is never followed by a capital (to_camel turns e2b into e2B)
                assert re.fullmatch(r"[a-z][A-Za-z0-9]*", name) and not re.search(r"[0-9][A-Z]", name), (
                    f"{path}.{name}"
                )


# Short names of kinds commonly installed next to harnessrl (kubectl resolves a clash to one of them, silently):
# Kubernetes' own, Tekton, Argo Workflows/CD/Rollouts, Kubeflow, Kueue, KubeRay, cert-manager, Knative, Istio.
WELL_KNOWN_SHORT_NAMES = {
    "cm", "cs", "csr", "ds", "deploy", "ep", "ev", "hpa", "ing", "limits", "no", "ns", "netpol", "pc", "pdb",
    "po", "psp", "pv", "pvc", "quota", "rc", "rs", "sa", "sc", "sts", "svc",
    "tr", "pr", "t", "p", "ct", "tt", "tb", "el",  # Tekton: TaskRun, PipelineRun, Task, Pipeline, ...
    "wf", "wftmpl", "cwf", "cwft", "app", "apps", "appproj", "ro", "ar", "at",  # Argo
    "tj", "pytorchjob", "mpij", "ptj", "tfj",  # Kubeflow training
    "cq", "lq", "wl", "rf",  # Kueue
    "rayjob", "raycluster", "rayservice",  # KubeRay
    "cert", "certs", "cr", "crs", "ksvc", "kcfg", "kroute", "rev", "vs", "gw", "dr", "se",
}


def test_crd_wiring(crds: dict[str, dict[str, Any]]) -> None:
    run, pool = crds["trainingruns.harnessrl.io.yaml"], crds["harnesspools.harnessrl.io.yaml"]
    for crd, short in ((run, "hrun"), (pool, "hp")):
        assert short not in WELL_KNOWN_SHORT_NAMES
        assert crd["spec"]["group"] == "harnessrl.io" and crd["spec"]["scope"] == "Namespaced"
        assert (
            crd["spec"]["names"]["shortNames"] == [short]
            and "harnessrl" in crd["spec"]["names"]["categories"]
        )
        (version,) = crd["spec"]["versions"]
        assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
        assert version["subresources"]["status"] == {}
        for column in version["additionalPrinterColumns"]:
            assert "conditions[" not in column["jsonPath"] or column["jsonPath"].startswith(
                '.status.conditions[?(@.type=="'
            ), column  # by type, never by position
    assert "scale" not in run["spec"]["versions"][0]["subresources"]
    assert pool["spec"]["versions"][0]["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    ready = [c for c in run["spec"]["versions"][0]["additionalPrinterColumns"] if c["name"] == "Ready"]
    assert ready[0]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    spec = schema_of(run)["properties"]["spec"]["properties"]
    assert spec["grpo"]["properties"]["groupSize"]["minimum"] == 2
    assert spec["grpo"]["properties"]["groupSize"]["default"] == 8
    assert {"rule": "self == oldSelf", "message": "model.base is immutable"} in spec["model"]["properties"][
        "base"
    ]["x-kubernetes-validations"]
    assert schema_of(pool)["properties"]["spec"]["properties"]["replicas"]["minimum"] == 0


def test_every_cel_rule_compiles(crds: dict[str, dict[str, Any]]) -> None:
    rules = [rule["rule"] for crd in crds.values() for _, node in nodes(schema_of(crd))
             for rule in node.get("x-kubernetes-validations", [])]  # fmt: skip
    assert len(rules) >= 12
    for rule in rules:
        cel.compile(rule)


def test_schema_defaults_are_valid_model_values() -> None:
    # The server applies schema defaults; each must be a value the model accepts where it sits.
    run: dict[str, Any] = {"apiVersion": "harnessrl.io/v1alpha1", "kind": "TrainingRun", "metadata": {"name": "r"},
           "spec": {"model": {"base": {"hub": {"repo": "a/b"}}}, "tasks": {"hub": {"repo": "a/t"}},
                    "harnesses": [{"pool": "p"}]}}  # fmt: skip
    spec = schema_of(all_crds()["trainingruns.harnessrl.io.yaml"])["properties"]["spec"]
    for name, node in spec["properties"].items():
        if "default" in node:
            load_manifest({**run, "spec": {**run["spec"], name: node["default"]}})


def test_kubernetes_validate_strict_accepts_the_crds() -> None:
    exe = Path(sys.executable).parent / "kubernetes-validate"
    files = [str(p) for p in sorted(CRD_DIR.glob("*.yaml"))]
    result = subprocess.run([str(exe), "--strict", *files], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed") == 3, result.stdout


def test_kubernetes_validate_strict_rejects_an_unknown_schema_keyword(tmp_path: Path) -> None:
    # Shows the check above has teeth: strict mode looks inside the openAPIV3Schema.
    crd = yaml.safe_load((CRD_DIR / "harnesspools.harnessrl.io.yaml").read_text())
    schema_of(crd)["properties"]["spec"]["properties"]["concurrency"]["maxValue"] = 3
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(crd))
    exe = Path(sys.executable).parent / "kubernetes-validate"
    result = subprocess.run([str(exe), "--strict", str(broken)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "maxValue" in result.stdout + result.stderr


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_examples_load(path: Path) -> None:
    resource = load_manifest(path)
    assert resource.metadata.name == yaml.safe_load(path.read_text())["metadata"]["name"]


def test_every_known_harness_has_an_example() -> None:
    from harnessrl.operator.api import KNOWN_HARNESSES

    pools = [load_manifest(p) for p in VALID[1:]]
    names = {p.spec.harness.known.name for p in pools if isinstance(p, HarnessPool) and p.spec.harness.known}
    assert names == set(KNOWN_HARNESSES)
    assert (ROOT / "examples" / "harnesspools" / "custom.yaml") in VALID


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_examples_fail_with_their_model_message(path: Path) -> None:
    headers = dict(re.findall(r"^# (expect|expect-model): (.+)$", path.read_text(), re.M))
    assert set(headers) == {"expect", "expect-model"}, (
        f"{path} needs '# expect:' and '# expect-model:' headers"
    )
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    assert headers["expect-model"] in str(caught.value)
