"""Each cross-field Rule has two halves, the CEL the API server runs and the Python check `harnessrl run`
runs; here both are evaluated on the same values (CEL by the `common-expression-language` package, as the
emulator does) and must agree."""

from __future__ import annotations

import itertools
import re
from typing import Any

import cel
import pytest
from harnessrl.operator.api import common, harnesspool, trainingrun
from harnessrl.operator.api.common import ApiModel, Rule
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kube_emulator.cel_rules import CelRule, evaluate_rule
from tests.kube_emulator.values import MISSING


def _ruled_models() -> list[type[ApiModel]]:
    found: set[type[ApiModel]] = set()
    for module in (common, harnesspool, trainingrun):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, ApiModel):
                model: type[ApiModel] = value
                if model.rules:
                    found.add(model)
    return sorted(found, key=lambda cls: cls.__name__)


MODELS = _ruled_models()
EXACTLY_ONE = [cls for cls in MODELS if any(r.message.startswith("exactly one of") for r in cls.rules)]


def only_rule(model: type[ApiModel], marker: str) -> Rule:
    (rule,) = [r for r in model.rules if marker in r.cel]
    return rule


def cel_holds(rule: Rule, value: dict[str, Any]) -> bool:
    result = cel.compile(rule.cel).execute({"self": value})
    assert isinstance(result, bool), f"{rule.cel} gave {result!r}"
    return result


def python_names(model: type[ApiModel]) -> dict[str, str]:
    return {field.alias or name: name for name, field in model.model_fields.items()}


def test_every_rule_is_covered() -> None:
    covered = {
        "exactly one of",
        "clipHigh",
        "weightSync",
        "dialect",
        "{instruction}",
        "'..'",
        "metadata.name",
        "toleration",
        "checkpointEvery",
        "reportTo",
        "valueFrom",
        "moved to",
        "vllmImportanceSamplingClipMin",
        "grpo.beta",
        "validationSplit",
    }
    for model in MODELS:
        for rule in model.rules:
            assert any(marker in rule.message or marker in rule.cel for marker in covered), rule


@pytest.mark.parametrize("model", EXACTLY_ONE, ids=lambda m: m.__name__)
def test_exactly_one_agrees_on_every_subset(model: type[ApiModel]) -> None:
    rule = next(r for r in model.rules if r.message.startswith("exactly one of"))
    members = re.findall(r"has\(self\.(\w+)\)", rule.cel)
    assert len(members) >= 2
    names = python_names(model)
    for size in range(len(members) + 1):
        for subset in itertools.combinations(members, size):
            instance = model.model_construct(**{names[m]: object() for m in subset})
            assert rule.check(instance) == cel_holds(rule, {m: {} for m in subset}) == (size == 1), subset


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="./ab", max_size=10))
def test_pvc_path_rule_agrees(path: str) -> None:
    rule = only_rule(common.VolumePath, "matches")
    instance = common.VolumePath.model_construct(claim_name="c", path=path)
    assert rule.check(instance) == cel_holds(rule, {"claimName": "c", "path": path})


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(alphabet="ab1-.A_", max_size=45), st.from_regex(r"\A[a-z][-a-z0-9]{0,44}\Z")))
def test_name_rule_agrees(name: str) -> None:
    rule = trainingrun.TrainingRun.rules[0]
    instance = trainingrun.TrainingRun.model_construct(metadata=common.ObjectMeta.model_construct(name=name))
    assert rule.check(instance) == cel_holds(rule, {"metadata": {"name": name}})


@settings(max_examples=100, deadline=None)
@given(st.floats(0, 10, allow_nan=False), st.floats(0, 10, allow_nan=False))
def test_clip_rule_agrees(low: float, high: float) -> None:
    rule = only_rule(trainingrun.GrpoSpec, "self.clipHigh >= self.clipLow")
    instance = trainingrun.GrpoSpec.model_construct(clip_low=low, clip_high=high)
    assert rule.check(instance) == cel_holds(rule, {"clipLow": low, "clipHigh": high}) == (high >= low)


@pytest.mark.parametrize(("split", "validation"), [("test", None), ("test", "validation"), ("test", "test")])
def test_validation_split_rule_agrees(split: str, validation: str | None) -> None:
    rule = only_rule(trainingrun.EvalSpec, "validationSplit")
    instance = trainingrun.EvalSpec.model_construct(split=split, validation_split=validation)
    value = {"split": split} | ({"validationSplit": validation} if validation else {})
    assert rule.check(instance) == cel_holds(rule, value) == (validation != split)
    # Nor may the checkpoint be picked on the trained split.
    rule = only_rule(trainingrun.TrainingRunSpec, "validationSplit")
    spec = trainingrun.TrainingRunSpec.model_construct(
        tasks=trainingrun.TaskSource.model_construct(split=split), eval=instance)
    assert rule.check(spec) == cel_holds(rule, {"tasks": {"split": split}, "eval": value}) == (validation != split)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["dapo", "grpo", "cispo"]), st.floats(0.0, 3.0))
def test_cispo_cap_rule_agrees(loss_type: str, high: float) -> None:
    rule = only_rule(trainingrun.GrpoSpec, "cispo")
    instance = trainingrun.GrpoSpec.model_construct(loss_type=loss_type, clip_high=high)
    assert rule.check(instance) == cel_holds(rule, {"lossType": loss_type, "clipHigh": high}) == (
        loss_type != "cispo" or high >= 1.0)


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.none(), st.floats(0.0, 5.0)), st.floats(0.0, 5.0))
def test_importance_sampling_band_rule_agrees(low: float | None, high: float) -> None:
    rule = only_rule(trainingrun.GrpoSpec, "vllmImportanceSamplingClipMin")
    instance = trainingrun.GrpoSpec.model_construct(vllm_importance_sampling_clip_min=low,
                                                    vllm_importance_sampling_clip_max=high)
    value = {"vllmImportanceSamplingClipMax": high} | ({} if low is None else {"vllmImportanceSamplingClipMin": low})
    assert rule.check(instance) == cel_holds(rule, value) == (low is None or low <= high)


def test_kl_penalty_rule_agrees() -> None:
    rule = only_rule(trainingrun.TrainingRunSpec, "self.grpo.beta")
    for beta, adapter in itertools.product([0.0, 0.04], ["lora", "full"]):
        value = {"grpo": {"beta": beta}, "model": {"adapter": {adapter: {}}}}
        instance = trainingrun.TrainingRunSpec.model_construct(
            grpo=trainingrun.GrpoSpec.model_construct(beta=beta),
            model=trainingrun.ModelSpec.model_construct(
                adapter=trainingrun.AdapterSpec.model_construct(**{adapter: object()})
            ),
        )
        assert rule.check(instance) == cel_holds(rule, value) == (beta == 0.0 or adapter == "lora")


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="{}instrucoa -", max_size=16), st.booleans())
def test_custom_command_rule_agrees(command: str, with_placeholder: bool) -> None:
    command = command + " {instruction}" if with_placeholder else command
    rule = only_rule(harnesspool.CustomHarness, "instruction")
    instance = harnesspool.CustomHarness.model_construct(command=command)
    assert rule.check(instance) == cel_holds(rule, {"command": command})


def test_dialect_rule_agrees() -> None:
    rule = only_rule(harnesspool.KnownHarness, "dialect")
    for name, dialect in itertools.product(harnesspool.KNOWN_HARNESSES, [None, "openai-chat", "gemini"]):
        value = {"name": name} | ({"dialect": dialect} if dialect else {})
        instance = harnesspool.KnownHarness.model_construct(name=name, dialect=dialect)
        assert rule.check(instance) == cel_holds(rule, value) == (dialect is None or name == "opencode")


def test_weight_sync_rule_agrees() -> None:
    rule = only_rule(trainingrun.TrainingRunSpec, "self.engine.weightSync != 'lora'")
    for sync, adapter in itertools.product(["lora", "nccl", "restart"], ["lora", "full"]):
        value = {"engine": {"weightSync": sync}, "model": {"adapter": {adapter: {}}}}
        instance = trainingrun.TrainingRunSpec.model_construct(
            engine=trainingrun.EngineSpec.model_construct(weight_sync=sync),
            model=trainingrun.ModelSpec.model_construct(
                adapter=trainingrun.AdapterSpec.model_construct(**{adapter: object()})
            ),
        )
        assert rule.check(instance) == cel_holds(rule, value) == (sync != "lora" or adapter == "lora")


def test_secret_env_rule_agrees() -> None:
    (rule,) = common.SecretEnvVar.rules
    for value, source in itertools.product(["", "literal"], [None, {"secretKeyRef": {"name": "s3", "key": "secret"}}]):
        instance = common.SecretEnvVar.model_construct(name="X", value=value, value_from=source)
        cel_value = {"name": "X", "value": value, **({"valueFrom": source} if source else {})}
        assert rule.check(instance) == cel_holds(rule, cel_value) == (source is None or value == "")


def test_engine_pool_rule_agrees() -> None:
    rule = only_rule(trainingrun.TrainingRunSpec, "self.engine.pool")
    for sync, pool in itertools.product(["lora", "nccl", "restart"], [None, "qwen3-8b"]):
        value = {"engine": {"weightSync": sync, **({"pool": pool} if pool else {})}}
        instance = trainingrun.TrainingRunSpec.model_construct(
            engine=trainingrun.EngineSpec.model_construct(weight_sync=sync, pool=pool)
        )
        assert rule.check(instance) == cel_holds(rule, value) == (pool is None or sync == "lora")


@pytest.mark.parametrize("key", [None, "", "gpu"])
@pytest.mark.parametrize("operator", ["Exists", "Equal"])
@pytest.mark.parametrize("value", [None, "", "yes"])
@pytest.mark.parametrize("effect", [None, "NoSchedule", "NoExecute"])
@pytest.mark.parametrize("seconds", [None, 30])
def test_toleration_rules_agree(key: str | None, operator: str, value: str | None, effect: str | None,
                                seconds: int | None) -> None:
    fields = {"key": key, "operator": operator, "value": value, "effect": effect, "tolerationSeconds": seconds}
    present = {k: v for k, v in fields.items() if v is not None}
    instance = common.Toleration.model_construct(key=key, operator=operator, value=value, effect=effect,
                                                 toleration_seconds=seconds)
    for rule in common.Toleration.rules:
        assert rule.check(instance) == cel_holds(rule, present), (rule.message, present)
    # The API server's own rules (ValidateTolerations), which these stand in for:
    server_ok = (not (operator == "Exists" and value) and (seconds is None or effect == "NoExecute")
                 and (operator == "Exists" or bool(key)))
    assert all(rule.check(instance) for rule in common.Toleration.rules) == server_ok


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 400), st.integers(1, 400), st.booleans())
def test_export_cadence_rule_agrees(every: int, checkpoint: int, with_export: bool) -> None:
    rule = only_rule(trainingrun.TrainingRunSpec, "checkpointEvery")
    value: dict[str, Any] = {"learner": {"checkpointEvery": checkpoint}}
    export = None
    if with_export:
        value["export"] = {"everySteps": every}
        export = trainingrun.ExportSpec.model_construct(every_steps=every)
    instance = trainingrun.TrainingRunSpec.model_construct(
        export=export, learner=trainingrun.LearnerSpec.model_construct(checkpoint_every=checkpoint))
    assert rule.check(instance) == cel_holds(rule, value) == (not with_export or every % checkpoint == 0)


def test_tracking_rules_agree() -> None:
    names = ["tensorboard", "wandb", "mlflow", "trackio", "none"]
    settings_of = ["wandb", "mlflow", "trackio"]
    for size, configured in itertools.product(range(1, 4), itertools.chain.from_iterable(
            itertools.combinations(settings_of, n) for n in range(4))):
        for report_to in itertools.combinations(names, size):
            value = {"reportTo": list(report_to)} | {name: {} for name in configured}
            instance = trainingrun.TrackingSpec.model_construct(report_to=list(report_to), **{n: object() for n in configured})
            for rule in trainingrun.TrackingSpec.rules:
                assert rule.check(instance) == cel_holds(rule, value), (rule.message, value)
            expected = (("none" not in report_to or size == 1)
                        and all((name in report_to) == (name in configured) for name in ("wandb", "mlflow"))
                        and ("trackio" in report_to or "trackio" not in configured))
            assert all(rule.check(instance) for rule in trainingrun.TrackingSpec.rules) == expected, value


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(alphabet="aZ9-_./", max_size=12), st.from_regex(common.QUALIFIED_NAME, fullmatch=True),
                 st.from_regex(common.RESOURCE_NAME, fullmatch=True)))
def test_map_key_rules_agree(key: str) -> None:
    for marker in (common.LABEL_KEYS, common.ANNOTATION_KEYS, common.RESOURCE_KEYS):
        # The emulator's CEL (with the Kubernetes string library's lowerAscii), as the API server evaluates it.
        in_cel = evaluate_rule(CelRule(rule=marker.cel(), message=marker.message), {key: "v"}, MISSING, "spec") is None
        try:
            marker._check({key: "v"})
            in_python = True
        except ValueError:
            in_python = False
        assert in_cel == in_python, (marker.message, key)


def test_moved_queue_name_rule_agrees() -> None:
    (rule,) = common.PodOverrides.rules
    assert "spec.queueName" in rule.message
    for value in [{}, {"queueName": "team-a"}, {"nodeSelector": {"gpu": "h100"}}]:
        instance = common.PodOverrides.model_construct(queue_name=value.get("queueName"))
        assert rule.check(instance) == cel_holds(rule, value) == ("queueName" not in value)
