"""The TrainingRun / HarnessPool pydantic models: defaults, camelCase aliases, rules, and clear errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from harnessrl.operator.api import (
    KNOWN_HARNESSES,
    Condition,
    HarnessPool,
    ManifestError,
    TrainingRun,
    load_manifest,
    load_manifests,
    set_condition,
)
from harnessrl.operator.api.harnesspool import HarnessPoolSpec
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[2]


def run(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"base": {"hub": {"repo": "Qwen/Qwen3-8B"}}},
        "tasks": {"hub": {"repo": "org/tasks"}},
        "harnesses": [{"pool": "codex"}],
    }
    return {"apiVersion": "harnessrl.io/v1alpha1", "kind": "TrainingRun", "metadata": {"name": "r"},
            "spec": {**base, **spec}}  # fmt: skip


def pool(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "harnessrl.io/v1alpha1", "kind": "HarnessPool", "metadata": {"name": "p"},
            "spec": {"harness": {"known": {"name": "codex"}}, **spec}}  # fmt: skip


def error_of(manifest: dict[str, Any]) -> str:
    with pytest.raises(ManifestError) as caught:
        load_manifest(manifest)
    return str(caught.value)


def test_trainingrun_defaults_follow_the_architecture() -> None:
    spec = load_manifest(run()).spec
    assert isinstance(spec, TrainingRunSpec)
    assert spec.grpo.group_size == 8 and spec.grpo.clip_low <= spec.grpo.clip_high
    assert (spec.reward.bonus, spec.reward.scale) == (0.1, 15.0)
    assert spec.model.adapter.lora is not None and spec.model.adapter.full is None
    assert spec.engine.weight_sync == "lora"
    assert spec.harnesses[0].weight == 1
    assert spec.eval is None and spec.export is None and spec.suspend is False
    assert spec.tracking.report_to == ["tensorboard"] and spec.tracking.project == "harnessrl"


def test_harnesspool_defaults_to_a_pod_per_rollout() -> None:
    spec = load_manifest(pool()).spec
    assert isinstance(spec, HarnessPoolSpec)
    assert spec.sandbox.kubernetes is not None and spec.sandbox.e2b is None and spec.sandbox.local is None
    assert (spec.replicas, spec.concurrency) == (1, 8)
    assert spec.timeouts.harness_seconds > spec.timeouts.grader_seconds


def test_camel_case_on_the_wire_python_names_accepted() -> None:
    by_alias = load_manifest(run(grpo={"groupSize": 4, "maxStaleness": 2}))
    by_name = load_manifest(run(grpo={"group_size": 4, "max_staleness": 2}))
    assert by_alias == by_name
    dumped = by_alias.model_dump(mode="json", exclude_none=True)
    assert dumped["apiVersion"] == "harnessrl.io/v1alpha1"
    assert dumped["spec"]["grpo"]["groupSize"] == 4 and "group_size" not in dumped["spec"]["grpo"]
    assert TrainingRun.model_validate(json.loads(by_alias.model_dump_json())) == by_alias


def test_special_aliases_keep_their_spelling() -> None:
    spec = load_manifest(pool(sandbox={"local": {"memoryMiB": 512}})).spec
    assert isinstance(spec, HarnessPoolSpec) and spec.sandbox.local is not None
    assert spec.sandbox.local.memory_mib == 512
    dumped = spec.model_dump(exclude_none=True)
    assert dumped["sandbox"] == {"local": {"cpuSeconds": 3600, "memoryMiB": 512, "network": "proxy",
                                           "allowUnisolated": False}}
    e2b = {"template": "t", "apiKeySecret": {"name": "e2b"}, "proxyUrl": "https://proxy.example.com"}
    assert load_manifest(pool(sandbox={"e2b": e2b})).spec.model_dump()["sandbox"]["e2b"]["template"] == "t"


def test_errors_name_the_field_in_the_manifest_terms() -> None:
    message = error_of(run(grpo={"groupSize": 1}, engine={"replicas": 0}))
    assert "TrainingRun 'r' is invalid" in message
    assert "spec.grpo.groupSize: Input should be greater than or equal to 2" in message
    assert "spec.engine.replicas: Input should be greater than or equal to 1" in message
    # A union member tag ('int', 'constrained-str') never leaks into the path.
    message = error_of(pool(resources={"limits": {"memory": "8 gigs"}}))
    assert "spec.resources.limits.memory: Input should be a Kubernetes quantity such as 2, 500m or 16Gi" in message
    assert "[" not in message.split("spec.resources.limits.memory")[1].split(":")[0]


def test_list_paths_use_indices() -> None:
    message = error_of(run(harnesses=[{"pool": "codex"}, {"pool": "Not_A_Name"}]))
    assert "spec.harnesses[1].pool: String should match pattern" in message


def test_unknown_fields_are_rejected_not_dropped() -> None:
    assert "spec.grpo.groupsize: Extra inputs are not permitted" in error_of(run(grpo={"groupsize": 4}))


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        ({"apiVersion": "v1", "kind": "TrainingRun"}, "apiVersion must be harnessrl.io/v1alpha1, got 'v1'"),
        ({"apiVersion": "harnessrl.io/v1alpha1", "kind": "Pod"}, "kind must be one of TrainingRun, HarnessPool"),
        ({"apiVersion": "harnessrl.io/v1alpha1", "kind": "TrainingRun", "metadata": {"name": "r"}},
         "spec: Field required"),
    ],
)  # fmt: skip
def test_envelope_errors(manifest: dict[str, Any], expected: str) -> None:
    assert expected in error_of(manifest)


def test_files_multi_documents_and_bad_yaml(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text(json.dumps(run()) + "\n---\n" + json.dumps(pool()) + "\n")
    assert [type(r) for r in load_manifests(both)] == [TrainingRun, HarnessPool]
    with pytest.raises(ManifestError, match="expected one manifest, found 2"):
        load_manifest(both)
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    with pytest.raises(ManifestError, match=r"broken\.yaml: not valid YAML"):
        load_manifest(broken)
    with pytest.raises(ManifestError, match="cannot read"):
        load_manifest(tmp_path / "missing.yaml")
    bad_second = tmp_path / "bad.yaml"
    bad_second.write_text(json.dumps(run()) + "\n---\n" + json.dumps(pool(concurrency=0)) + "\n")
    with pytest.raises(ManifestError, match=r"\(document 2\): HarnessPool 'p' is invalid"):
        load_manifests(bad_second)


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (run(tasks={"split": "train"}), "spec.tasks: exactly one of hub, pvc or image must be set"),
        (run(model={"base": {}}), "spec.model.base: exactly one of hub or pvc must be set"),
        (run(model={"base": {"hub": {"repo": "a/b"}}, "adapter": {"lora": {}, "full": {}}}),
         "spec.model.adapter: exactly one of lora or full must be set"),
        (run(model={"base": {"hub": {"repo": "a/b"}}, "adapter": {"full": {}}}, engine={"weightSync": "nccl"}), None),
        (run(grpo={"clipLow": 0.3, "clipHigh": 0.3}), None),
        (run(eval={"harnesses": ["codex", "codex"]}), "spec.eval.harnesses: 'codex' is listed more than once"),
        (run(engine={"env": [{"name": "A"}, {"name": "A", "value": "x"}]}),
         "spec.engine.env: name 'A' is listed more than once"),
        (run(tracking={"reportTo": ["tensorboard", "wandb"], "wandb": {"apiKeySecret": {"name": "wandb"}}}), None),
        (run(tracking={"reportTo": ["mlflow"], "mlflow": {"trackingUriSecret": {"name": "m", "key": "uri"}}}), None),
        (run(tracking={"reportTo": ["trackio"]}), None),  # local files: no Space, no token
        (run(tracking={"reportTo": ["none"]}), None),
        (run(tracking={"reportTo": ["wandb"]}),
         "spec.tracking: tracking.wandb must be set exactly when tracking.reportTo lists wandb"),
        (run(tracking={"mlflow": {"trackingUriSecret": {"name": "m"}}}),
         "spec.tracking: tracking.mlflow must be set exactly when tracking.reportTo lists mlflow"),
        (run(tracking={"trackio": {"spaceId": "org/board", "tokenSecret": {"name": "hf"}}}),
         "spec.tracking: tracking.trackio is set but tracking.reportTo does not list trackio"),
        (run(tracking={"reportTo": ["none", "tensorboard"]}), "tracking.reportTo: none cannot be listed with a tracker"),
        (run(tracking={"reportTo": ["tensorboard", "tensorboard"]}),
         "spec.tracking.reportTo: 'tensorboard' is listed more than once"),
        (run(tracking={"reportTo": ["comet"]}), "spec.tracking.reportTo[0]: Input should be 'tensorboard', 'wandb', 'mlflow', 'trackio' or 'none'"),
        (run(tracking={"reportTo": []}), "spec.tracking.reportTo: List should have at least 1 item"),
        # A credential is a Secret reference, never the value.
        (run(tracking={"reportTo": ["wandb"], "wandb": {"apiKey": "0123abcd"}}), "spec.tracking.wandb.apiKey: Extra"),
        (pool(harness={}), "spec.harness: exactly one of known or custom must be set"),
        (pool(harness={"known": {"name": "opencode", "dialect": "gemini"}}), None),
        (pool(sandbox={}), "spec.sandbox: exactly one of kubernetes, e2b or local must be set"),
        (pool(replicas=0), None),
    ],
)  # fmt: skip
def test_cross_field_rules(manifest: dict[str, Any], expected: str | None) -> None:
    if expected is None:
        load_manifest(manifest)
    else:
        assert expected in error_of(manifest)


def test_pvc_paths_stay_inside_the_volume() -> None:
    for path in ("..", "a/../b", "a/.."):
        assert "path may not contain a '..' segment" in error_of(
            run(tasks={"pvc": {"claimName": "t", "path": path}})
        )
    assert "String should match pattern" in error_of(run(tasks={"pvc": {"claimName": "t", "path": "/abs"}}))
    load_manifest(run(tasks={"pvc": {"claimName": "t", "path": "a/..b/c..d"}}))


def test_known_harnesses_are_the_ones_the_runner_pins() -> None:
    pins = json.loads((ROOT / "runtime" / "contracts" / "harness_versions.json").read_text())
    assert set(KNOWN_HARNESSES) == set(pins)


def test_set_condition_moves_transition_time_only_on_change() -> None:
    t0 = datetime(2026, 11, 30, tzinfo=UTC)
    conditions = set_condition([], "Ready", "False", "Starting", now=t0)
    conditions = set_condition(conditions, "Training", "True", "Stepping", now=t0)
    later = set_condition(conditions, "Ready", "False", "StillStarting", "3/4 up", generation=2,
                          now=t0 + timedelta(minutes=1))  # fmt: skip
    assert [c.type for c in later] == ["Ready", "Training"]
    assert later[0].last_transition_time == t0 and later[0].reason == "StillStarting"
    assert later[0].observed_generation == 2
    flipped = set_condition(later, "Ready", "True", "AllUp", now=t0 + timedelta(minutes=2))
    assert flipped[0].last_transition_time == t0 + timedelta(minutes=2)
    assert flipped[1] == conditions[1]
    dumped = flipped[0].model_dump(mode="json")
    assert dumped["lastTransitionTime"] == "2026-11-30T00:02:00Z"


def test_condition_rejects_a_lowercase_status() -> None:
    with pytest.raises(ValidationError, match="Input should be 'True', 'False' or 'Unknown'"):
        Condition.model_validate(
            {"type": "Ready", "status": "true", "reason": "X", "lastTransitionTime": "2026-01-01T00:00:00Z"}
        )


def test_a_key_written_twice_is_an_error_not_the_last_one_wins(tmp_path: Path) -> None:
    manifest = tmp_path / "pool.yaml"
    manifest.write_text("apiVersion: harnessrl.io/v1alpha1\nkind: HarnessPool\nmetadata: {name: p}\n"
                        "spec:\n  concurrency: 2\n  harness: {known: {name: codex}}\n  concurrency: 4\n")
    with pytest.raises(ManifestError) as caught:
        load_manifest(manifest)
    assert "mapping key 'concurrency' is already defined above" in str(caught.value)
    assert "line 7" in str(caught.value)
