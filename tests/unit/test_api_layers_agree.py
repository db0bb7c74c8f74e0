"""The Python models (`harnessrl run`) and the CRD schema (the API server) accept and refuse the same manifests.

Manifests are generated from the examples by setting fields (found in the CRD schema) to values of every kind:
the right type, a string that looks like a number or boolean ("8", "true", "1e-5"), an integral float, a
negative number, out-of-range or odd strings, unknown fields. The server side is the emulator's admission code
(schema pruning, defaulting, validation and CEL rules, with kubectl's `fieldValidation=Strict`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from harnessrl.operator.api import ManifestError, load_manifest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kube_emulator.builtin_rules import object_meta_causes
from tests.kube_emulator.schema import prune_and_default, validate
from tests.kube_emulator.values import MISSING

ROOT = Path(__file__).resolve().parents[2]
CRDS = {c["spec"]["names"]["kind"]: c for c in (yaml.safe_load(p.read_text()) for p in (ROOT / "crds").glob("*.yaml"))}
EXAMPLES = {"TrainingRun": yaml.safe_load((ROOT / "examples" / "trainingrun.yaml").read_text()),
            "HarnessPool": yaml.safe_load((ROOT / "examples" / "harnesspools" / "opencode.yaml").read_text()),
            "EnginePool": yaml.safe_load((ROOT / "examples" / "enginepools" / "qwen3-8b.yaml").read_text())}


def schema_of(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = CRDS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def server_accepts(manifest: dict[str, Any]) -> tuple[bool, str]:
    schema = schema_of(manifest["kind"])
    dropped: list[str] = []
    obj = prune_and_default(schema, copy.deepcopy(manifest), root=True, dropped=dropped)
    if dropped:  # kubectl's default: fieldValidation=Strict
        return False, f"unknown fields {dropped}"
    causes = object_meta_causes(obj.get("metadata") or {}) + validate(schema, obj, "", MISSING, root=True)
    return not causes, "; ".join(f"{c['field']}: {c['message']}" for c in causes)


def model_accepts(manifest: dict[str, Any]) -> tuple[bool, str]:
    try:
        load_manifest(manifest)
    except ManifestError as e:
        return False, str(e)
    return True, ""


def _leaf_paths(schema: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    out = [(prefix, schema)] if prefix else []
    for name, sub in (schema.get("properties") or {}).items():
        out += _leaf_paths(sub, (*prefix, name))
    if isinstance(schema.get("items"), dict):
        out += _leaf_paths(schema["items"], (*prefix, "0"))
    if isinstance(schema.get("additionalProperties"), dict):
        out += _leaf_paths(schema["additionalProperties"], (*prefix, "cpu"))  # a key every map takes
    return out


PATHS = {kind: [(p, s) for p, s in _leaf_paths(schema_of(kind)["properties"]["spec"])
                if "x-kubernetes-preserve-unknown-fields" not in s] for kind in CRDS}


def well_typed(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A value of the field's type, mostly within its bounds: what a careful user writes."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        return st.integers(schema.get("minimum", -10), schema.get("maximum", 10**6))
    if kind == "number":
        return st.floats(schema.get("minimum", -10), schema.get("maximum", 10**6), allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "string" and "pattern" in schema:
        return st.from_regex(schema["pattern"].removeprefix("^").removesuffix("$"), fullmatch=True).filter(
            lambda v: len(v) <= schema.get("maxLength", 10**6))
    if kind == "string":
        return st.text(alphabet="abc-/.", min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 20), 20))
    return st.just({})

ODD_VALUES = st.sampled_from([
    "8", "true", "1e-5", "-1", "0.5", "", " ", "a\n", "abc\n", "-lead", "UPPER", "x" * 70, "a/b/c", "a b", "a=b",
    "nvidia.com/gpu", "500m", "1Gi", "-1Gi", "Exists", "Equal", "NoExecute", "lora", "..", "../x", "{instruction}",
    8, 8.0, 8.5, -1, 0, 1, 2**31, 1e-5, True, False, None, [], {}, ["x"], {"a": "b"}, {"": "x"}, {"A B": "x"},
])
SCALARS = st.one_of(ODD_VALUES, st.integers(-5, 10**7), st.floats(-10, 10**6, allow_nan=False),
                    st.text(alphabet="aZ09-_./ =\n", max_size=12))


def _set(obj: Any, path: tuple[str, ...], value: Any) -> None:
    node = obj
    for part in path[:-1]:
        if isinstance(node, list):
            # Going through an item: make it an object if it is a scalar (or missing) so the path can continue.
            if not node or not isinstance(node[0], dict | list):
                node[:1] = [{}]
            node = node[0]
            continue
        child = node.get(part)
        if not isinstance(child, dict | list):
            child = [] if part == "0" else {}
            node[part] = child
        if isinstance(child, list) and not child:
            child.append({})
        node = child
    if isinstance(node, list):
        if node:
            node[0] = value
        else:
            node.append(value)
    elif isinstance(node, dict):
        node[path[-1]] = value


@st.composite
def manifests(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(CRDS)))
    manifest = copy.deepcopy(EXAMPLES[kind])
    for _ in range(draw(st.integers(1, 3))):
        path, schema = draw(st.sampled_from(PATHS[kind]))
        _set(manifest["spec"], path, draw(st.one_of(SCALARS, well_typed(schema))))
    if draw(st.integers(0, 9)) == 0:
        manifest["spec"][draw(st.sampled_from(["replica", "groupsize", "harness_", "extra"]))] = 1
    return manifest


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests())
def test_the_model_and_the_crd_schema_accept_the_same_manifests(manifest: dict[str, Any]) -> None:
    server, why_server = server_accepts(manifest)
    model, why_model = model_accepts(manifest)
    assert server == model, f"server {'accepts' if server else 'refuses: ' + why_server}; " \
                            f"model {'accepts' if model else 'refuses: ' + why_model}"


@pytest.mark.parametrize("value", ["8", "true", "1e-5"])
def test_strings_that_look_like_numbers_are_refused_by_both(value: str) -> None:
    manifest = copy.deepcopy(EXAMPLES["TrainingRun"])
    manifest["spec"]["grpo"] = {"groupSize": value} if value == "8" else {"learningRate": value} if value == "1e-5" else {}
    if value == "true":
        manifest["spec"]["suspend"] = value
    assert server_accepts(manifest)[0] is False
    assert model_accepts(manifest)[0] is False


def test_integral_floats_are_integers_for_both() -> None:
    manifest = copy.deepcopy(EXAMPLES["TrainingRun"])
    manifest["spec"]["grpo"] = {"groupSize": 8.0}
    assert server_accepts(manifest) == (True, "")
    assert model_accepts(manifest) == (True, "")
