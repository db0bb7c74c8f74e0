"""Building blocks shared by the TrainingRun and HarnessPool models.

Every API model derives from `ApiModel`: camelCase JSON names, unknown fields rejected, and
cross-field `Rule`s that are checked in Python *and* emitted as CEL `x-kubernetes-validations`
in the generated CRD, so `harnessrl run` and the API server reject the same manifests with the
same message.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, ClassVar, Final, Literal, Self, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StringConstraints,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

GROUP: Final = "harnessrl.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "harnessrl.io/v1alpha1"

# The labels the operator selects its children and their Pods by, under its own prefix: the recommended
# app.kubernetes.io/* labels belong to whoever deploys an application (Helm and Argo CD track their
# instances by app.kubernetes.io/instance), so the operator sets only the informative ones and selects on none.
RUN_LABEL: Final = f"{GROUP}/run"
COMPONENT_LABEL: Final = f"{GROUP}/component"
POOL_LABEL: Final = f"{GROUP}/pool"
# On an EnginePool's server Pods (selecting them, as RUN_LABEL selects a run's), and on the learner and proxy Pods
# of the runs on it (the pool's NetworkPolicy admits those).
ENGINE_POOL_LABEL: Final = f"{GROUP}/engine-pool"
# The uid of the run a child belongs to, on a child that outlives its run (a retained checkpoint claim).
RUN_UID_LABEL: Final = f"{GROUP}/run-uid"

# Kubernetes' own patterns, so a value accepted here is accepted by the API server.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
SECRET_KEY = r"^[-._a-zA-Z0-9]+$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Non-negative: the API server refuses a negative request or limit.
QUANTITY = r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
# A label, annotation, nodeSelector or toleration key: an optional DNS subdomain prefix and '/', then a name
# of at most 63 characters (validation.IsQualifiedName). `[.]`, not a backslash: the text is also a CEL literal.
_SUBDOMAIN_PREFIX = "[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
QUALIFIED_NAME = f"^({_SUBDOMAIN_PREFIX})?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$"
# A container resource: cpu, memory, ephemeral-storage, hugepages-<size>, or an extended resource (domain/name).
RESOURCE_NAME = (f"^(cpu|memory|ephemeral-storage|hugepages-[A-Za-z0-9.]+|{_SUBDOMAIN_PREFIX}"
                 "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
# Hugging Face repo ids: "name" or "namespace/name".
HUB_REPO = r"^[A-Za-z0-9][-A-Za-z0-9_.]*(/[A-Za-z0-9][-A-Za-z0-9_.]*)?$"
# An image reference: registry/path[:tag][@digest]; the registry validates the rest.
IMAGE = r"^[a-z0-9]([-a-z0-9_.:/]*[a-z0-9])?(:[A-Za-z0-9_][-A-Za-z0-9_.]{0,127})?(@sha256:[a-f0-9]{64})?$"

ResourceName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
LabelName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL)]
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE)]
HubRepo = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=HUB_REPO)]
Image = Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=IMAGE)]
Revision = Annotated[str, StringConstraints(min_length=1, max_length=256)]
# A path inside a volume: relative (the "no .. segment" half is a Rule on VolumePath).
RelativePath = Annotated[str, StringConstraints(max_length=1024, pattern=r"^([^/].*)?$")]
_PARENT_SEGMENT = r"(^|/)[.][.](/|$)"  # no backslashes: the same text is a CEL string literal
Arg = Annotated[str, StringConstraints(max_length=4096)]
def _one_quantity_error(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """One message for a bad quantity, instead of one per member of the int | str union."""
    try:
        return handler(value)
    except ValidationError:
        raise PydanticCustomError(
            "quantity", "Input should be a Kubernetes quantity such as 2, 500m or 16Gi (never negative)"
        ) from None


# A Kubernetes resource quantity ("2", "500m", "16Gi") or a plain integer; never negative.
Quantity = Annotated[
    Annotated[int, Field(ge=0)] | Annotated[str, StringConstraints(max_length=64, pattern=QUANTITY)],
    WrapValidator(_one_quantity_error),
]


@dataclass(frozen=True)
class Rule:
    """A cross-field rule: `cel` is evaluated by the API server, `check` by the Python model.

    Both must agree; `message` is what the user sees from either. Rules that need the old object
    (transition rules) have no Python side and are attached to a field's schema instead.
    """

    cel: str
    message: str
    check: Callable[[Any], bool]

    def schema(self) -> dict[str, str]:
        return {"rule": self.cel, "message": self.message}


def _add_rules(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    rules: tuple[Rule, ...] = getattr(cls, "rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.schema() for rule in rules]


def _is_int(annotation: Any) -> bool:
    """An `int` or `int | None` field (where the API server takes an integral number such as 8.0)."""
    return annotation is int or (get_origin(annotation) in (Union, UnionType) and set(get_args(annotation)) == {int, type(None)})


class ApiModel(BaseModel):
    """Base of every API model: camelCase aliases, Python names accepted too, no unknown fields.

    Strict types, as the CRD schema: "8" is no integer, "true" no boolean, "1e-5" no number, NaN no
    number. As the API server: an integral number (8.0) is an integer, and a null is an omitted field.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        json_schema_extra=_add_rules,
    )

    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _as_the_server_reads(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        # The API server drops nulls (no field is nullable) before it fills in defaults.
        fixed = {key: value for key, value in data.items() if value is not None}
        for name, field in cls.model_fields.items():
            for key in {name, field.alias or name}:
                value = fixed.get(key)
                if isinstance(value, float) and value.is_integer() and _is_int(field.annotation):
                    fixed[key] = int(value)
        return fixed

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        for rule in self.rules:
            if not rule.check(self):
                raise PydanticCustomError("rule", rule.message)
        return self


class _Marker:
    """An Annotated marker: a Python check after the field's own validation, and what the API server needs
    to make the same check, added to the field's schema."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        self._extend(out)
        return out

    def _check(self, value: Any) -> Any:
        raise NotImplementedError

    def _extend(self, out: JsonSchemaValue) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Unique(_Marker):
    """Annotated marker on a list: items unique by field `key` (a Kubernetes map list), or by value (a set).

    The API server enforces uniqueness from x-kubernetes-list-type; this makes the Python model agree.
    """

    key: str | None = None

    def _extend(self, out: JsonSchemaValue) -> None:
        out["x-kubernetes-list-type"] = "map" if self.key else "set"
        if self.key:
            out["x-kubernetes-list-map-keys"] = [to_camel(self.key)]

    def _check(self, items: list[Any]) -> list[Any]:
        seen: list[Any] = []
        for item in items:
            value = getattr(item, self.key) if self.key else item
            if value in seen:
                what = f"{to_camel(self.key)} {value!r}" if self.key else repr(value)
                raise PydanticCustomError("duplicate", "{what} is listed more than once", {"what": what})
            seen.append(value)
        return items


@dataclass(frozen=True)
class KeysMatch(_Marker):
    """Annotated marker on a map: every key matches `pattern` (after lowercasing when `lower`).

    A CRD schema cannot constrain map keys, so the API server checks them with a CEL rule on the map;
    the Python model checks the same pattern and says the same `message`.
    """

    pattern: str
    message: str
    lower: bool = False

    def _extend(self, out: JsonSchemaValue) -> None:
        out.setdefault("x-kubernetes-validations", []).append({"rule": self.cel(), "message": self.message})

    def cel(self) -> str:
        key = "k.lowerAscii()" if self.lower else "k"
        return f"self.all(k, {key}.matches('{self.pattern}'))"

    def _check(self, mapping: dict[str, Any]) -> dict[str, Any]:
        for key in mapping:
            # fullmatch, not search: Python's `$` also matches before a trailing newline, RE2's (CEL's) does not.
            if re.fullmatch(self.pattern.removeprefix("^").removesuffix("$"), key.lower() if self.lower else key) is None:
                raise PydanticCustomError("map_key", "{message} (got {key})", {"message": self.message, "key": repr(key)})
        return mapping


LABEL_KEYS = KeysMatch(QUALIFIED_NAME, "keys must be label keys: an optional DNS subdomain prefix and '/', then at most "
                       "63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
ANNOTATION_KEYS = KeysMatch(QUALIFIED_NAME, LABEL_KEYS.message.replace("label keys", "annotation keys"), lower=True)
RESOURCE_KEYS = KeysMatch(RESOURCE_NAME, "keys must be cpu, memory, ephemeral-storage, hugepages-<size> or an extended "
                          "resource such as nvidia.com/gpu")


def _join_or(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _by_alias(model: BaseModel, names: tuple[str, ...]) -> list[Any]:
    """The values of the fields whose JSON names are `names`."""
    python_name = {field.alias or name: name for name, field in type(model).model_fields.items()}
    return [getattr(model, python_name[name]) for name in names]


def exactly_one(*names: str) -> Rule:
    """Exactly one of the optional fields `names` (JSON names) must be set."""
    has = [f"has(self.{name})" for name in names]
    cel = f"{has[0]} != {has[1]}" if len(has) == 2 else f"[{', '.join(has)}].filter(x, x).size() == 1"
    return Rule(
        cel=cel,
        message=f"exactly one of {_join_or(list(names))} must be set",
        check=lambda model: sum(value is not None for value in _by_alias(model, names)) == 1,
    )


# Names of the resources' children (Services, StatefulSet Pods and their revision-hash labels) extend
# the resource's name, and must stay DNS labels of at most 63 characters.
MAX_NAME = 40
_NAME = f"^[a-z]([-a-z0-9]{{0,{MAX_NAME - 2}}}[a-z0-9])?$"


def name_rule(kind: str) -> Rule:
    """Root rule on metadata.name: short enough, and a DNS-1035 label, to name the resource's children."""
    return Rule(
        cel=f"self.metadata.name.matches('{_NAME}')",
        message=f"metadata.name must be a lowercase DNS label of at most {MAX_NAME} characters starting with "
        f"a letter: it prefixes the names of the {kind}'s Services and Pods",
        check=lambda resource: re.fullmatch(_NAME[1:-1], resource.metadata.name) is not None,
    )


def queue_name_field(kind: str, admitted: str) -> Any:
    """spec.queueName of a kind the operator admits through Kueue as one Workload (handlers/admission.py)."""
    return Field(
        default=None,
        description=f"Kueue LocalQueue that admits {admitted}: its Pods start only once Kueue admits it, and "
        f"stop when Kueue evicts it. Kueue must list `{kind}.{VERSION}.{GROUP}` in "
        "`integrations.externalFrameworks`. A change re-queues it.",
    )


def immutable(what: str) -> dict[str, Any]:
    """Schema extra for a field that may not change once set (a CEL transition rule)."""
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": f"{what} is immutable"}]}


def free_form() -> dict[str, Any]:
    """Schema extra for a field whose content Kubernetes defines (kept as is, not pruned)."""
    return {"x-kubernetes-preserve-unknown-fields": True}


class SecretKeyRef(ApiModel):
    """A key in a Secret in the resource's namespace."""

    name: ResourceName = Field(description="Name of the Secret.")
    key: Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=SECRET_KEY)] = Field(
        default="token", description="Key within the Secret whose value is used."
    )


class VolumePath(ApiModel):
    """A path inside a PersistentVolumeClaim mounted read-only."""

    rules = (
        Rule(
            cel=f"!self.path.matches('{_PARENT_SEGMENT}')",
            message="path may not contain a '..' segment",
            # `\Z` for `$`: RE2's `$` (CEL's) is the end of the text, Python's also matches before a final newline.
            check=lambda v: re.search(_PARENT_SEGMENT.replace("$", r"\Z"), v.path) is None,
        ),
    )

    claim_name: ResourceName = Field(
        description="Name of the PersistentVolumeClaim in the resource's namespace."
    )
    path: RelativePath = Field(default="", description="Directory inside the volume; empty for its root.")


class ResourceRequirements(ApiModel):
    """Compute resources of a container, as in a Pod spec."""

    requests: Annotated[dict[str, Quantity], RESOURCE_KEYS] = Field(
        default_factory=dict, max_length=16, description="Minimum resources, e.g. {cpu: 2, memory: 8Gi}."
    )
    limits: Annotated[dict[str, Quantity], RESOURCE_KEYS] = Field(
        default_factory=dict, max_length=16, description="Maximum resources, e.g. {memory: 8Gi}."
    )


class EnvVar(ApiModel):
    """An environment variable with a literal value."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=ENV_NAME)] = Field(
        description="Variable name."
    )
    value: Annotated[str, StringConstraints(max_length=4096)] = Field(
        default="", description="Variable value."
    )


class EnvSource(ApiModel):
    """Where an environment variable's value comes from."""

    secret_key_ref: SecretKeyRef = Field(
        description="A key of a Secret in the resource's namespace: the value never appears in the spec, the "
        "components' configs or their logs."
    )


class SecretEnvVar(EnvVar):
    """An environment variable: a literal value, or a key of a Secret (valueFrom.secretKeyRef)."""

    rules = (
        Rule(
            cel="!has(self.valueFrom) || self.value == ''",
            message="an environment variable takes value or valueFrom, not both",
            check=lambda v: v.value_from is None or v.value == "",
        ),
    )

    value_from: EnvSource | None = Field(default=None, description="Take the value from a Secret instead.")


class Toleration(ApiModel):
    """A Pod toleration, as in a Pod spec (with the API server's rules on one, ValidateTolerations)."""

    rules = (
        Rule(
            cel="self.operator != 'Exists' || !has(self.value) || self.value == ''",
            message="a toleration with operator Exists may not have a value",
            check=lambda t: t.operator != "Exists" or not t.value,
        ),
        Rule(
            cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="tolerationSeconds needs effect NoExecute",
            check=lambda t: t.toleration_seconds is None or t.effect == "NoExecute",
        ),
        Rule(
            cel="self.operator == 'Exists' || (has(self.key) && self.key != '')",
            message="a toleration without a key (matching every taint) needs operator Exists",
            check=lambda t: t.operator == "Exists" or bool(t.key),
        ),
    )

    key: Annotated[str, StringConstraints(max_length=316, pattern=QUALIFIED_NAME)] | None = Field(
        default=None, description="Taint key the toleration applies to; empty matches all keys (with Exists)."
    )
    operator: Literal["Exists", "Equal"] = Field(
        default="Equal", description="How key and value are compared."
    )
    value: LabelValue | None = Field(default=None, description="Taint value to match with operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None,
        ge=0,
        le=31_536_000,
        description="How long a NoExecute taint is tolerated before eviction.",
    )


class PodOverrides(ApiModel):
    """Scheduling settings copied into every Pod the operator creates for this resource."""

    # A field that moved stays in the schema with a rule refusing it: pruned instead, a queue set where it used to
    # be would leave the run unqueued, its GPUs outside Kueue's quota, with only a warning the client may not show.
    rules = (
        Rule(
            cel="!has(self.queueName)",
            message="pod.queueName moved to spec.queueName (of the TrainingRun or EnginePool): set the Kueue "
            "LocalQueue there; here it would be ignored and the Pods would bypass the queue's quota",
            check=lambda p: p.queue_name is None,
        ),
    )

    node_selector: Annotated[dict[str, LabelValue], LABEL_KEYS] = Field(
        default_factory=dict, max_length=32, description="Node labels the Pods must match."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Taints the Pods tolerate."
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="A Kubernetes Pod affinity (nodeAffinity, podAffinity, podAntiAffinity), copied as is.",
        json_schema_extra=free_form(),
    )
    priority_class_name: ResourceName | None = Field(default=None, description="PriorityClass of the Pods.")
    labels: Annotated[dict[str, LabelValue], LABEL_KEYS] = Field(
        default_factory=dict,
        max_length=32,
        description="Extra labels on the Pods; the operator's own labels (which its selectors use) win over these.",
    )
    annotations: Annotated[dict[str, Annotated[str, StringConstraints(max_length=4096)]], ANNOTATION_KEYS] = Field(
        default_factory=dict, max_length=32, description="Extra annotations on the Pods."
    )
    service_account_name: ResourceName | None = Field(
        default=None, description="ServiceAccount the Pods run as; the operator's default when empty."
    )
    queue_name: Annotated[str, StringConstraints(max_length=253)] | None = Field(
        default=None, description="Moved to spec.queueName; refused here.", exclude=True
    )


class ObjectMeta(ApiModel):
    """The part of metav1.ObjectMeta the operator reads; the rest is kept as is."""

    model_config = ConfigDict(extra="allow")

    name: ResourceName = Field(description="Name of the resource.")
    namespace: LabelName | None = Field(default=None, description="Namespace of the resource.")
    # The API server checks these on every object (ValidateObjectMeta); the CRD schema cannot.
    labels: Annotated[dict[str, LabelValue], LABEL_KEYS] = Field(default_factory=dict, description="Labels.")
    annotations: Annotated[dict[str, str], ANNOTATION_KEYS] = Field(default_factory=dict, description="Annotations.")
    uid: str | None = Field(default=None, description="Set by the API server.")
    generation: int | None = Field(default=None, description="Set by the API server; bumped on spec changes.")
    resource_version: str | None = Field(default=None, description="Set by the API server.")
