"""The two CustomResourceDefinitions, built from the API models. Pure: dicts in, dicts out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harnessrl.operator.api.common import GROUP, VERSION, ApiModel
from harnessrl.operator.api.enginepool import KIND as ENGINE_POOL_KIND
from harnessrl.operator.api.enginepool import PLURAL as ENGINE_POOL_PLURAL
from harnessrl.operator.api.enginepool import EnginePool, EnginePoolSpec, EnginePoolStatus
from harnessrl.operator.api.harnesspool import KIND as POOL_KIND
from harnessrl.operator.api.harnesspool import PLURAL as POOL_PLURAL
from harnessrl.operator.api.harnesspool import HarnessPool, HarnessPoolSpec, HarnessPoolStatus
from harnessrl.operator.api.reasons import COMPLETE, READY, TRAINING
from harnessrl.operator.api.schema import structural_schema
from harnessrl.operator.api.structural import structural_errors
from harnessrl.operator.api.trainingrun import KIND as RUN_KIND
from harnessrl.operator.api.trainingrun import PLURAL as RUN_PLURAL
from harnessrl.operator.api.trainingrun import TrainingRun, TrainingRunSpec, TrainingRunStatus

CATEGORIES = ["harnessrl"]


def column(name: str, type_: str, path: str, description: str, priority: int = 0) -> dict[str, Any]:
    out = {"name": name, "type": type_, "jsonPath": path, "description": description}
    return {**out, "priority": priority} if priority else out


def condition_column(type_: str, priority: int = 0) -> dict[str, Any]:
    """A printer column showing one condition's status, found by type (conditions have no fixed order)."""
    path = f'.status.conditions[?(@.type=="{type_}")].status'
    return column(type_, "string", path, f"Status of the {type_} condition.", priority)


AGE = column("Age", "date", ".metadata.creationTimestamp", "Time since creation.")


@dataclass(frozen=True)
class Kind:
    """What differs between the two CRDs."""

    resource: type[ApiModel]
    spec: type[ApiModel]
    status: type[ApiModel]
    kind: str
    plural: str
    short_name: str
    columns: list[dict[str, Any]]
    scale: bool = False

    @property
    def name(self) -> str:
        return f"{self.plural}.{GROUP}"


KINDS = (
    Kind(
        resource=TrainingRun,
        spec=TrainingRunSpec,
        status=TrainingRunStatus,
        kind=RUN_KIND,
        plural=RUN_PLURAL,
        short_name="hrun",  # not `tr`: Tekton's TaskRun has it
        columns=[
            condition_column(READY),
            condition_column(TRAINING),
            condition_column(COMPLETE, priority=1),
            column("Phase", "string", ".status.phase", "Summary of the conditions."),
            column("Step", "integer", ".status.step", "Optimiser steps taken."),
            column("Reward", "number", ".status.meanReward", "Mean reward of the last step."),
            column("Policy", "integer", ".status.policyVersion", "Policy version served.", priority=1),
            column("Checkpoint", "string", ".status.latestCheckpoint", "Latest checkpoint.", priority=1),
            AGE,
        ],
    ),
    Kind(
        resource=HarnessPool,
        spec=HarnessPoolSpec,
        status=HarnessPoolStatus,
        kind=POOL_KIND,
        plural=POOL_PLURAL,
        short_name="hp",
        columns=[
            column("Harness", "string", ".spec.harness.known.name", "Known harness."),
            column("Version", "string", ".status.harnessVersion", "CLI version run (the pinned one when unset)."),
            column("Custom", "string", ".spec.harness.custom.name", "Custom harness.", priority=1),
            condition_column(READY),
            column("Desired", "integer", ".spec.replicas", "Runner Pods wanted."),
            column("Available", "integer", ".status.readyReplicas", "Runner Pods ready."),
            column("Completed", "integer", ".status.rollouts.completed", "Rollouts graded."),
            column("Phase", "string", ".status.phase", "Summary of the conditions.", priority=1),
            AGE,
        ],
        scale=True,
    ),
    Kind(
        resource=EnginePool,
        spec=EnginePoolSpec,
        status=EnginePoolStatus,
        kind=ENGINE_POOL_KIND,
        plural=ENGINE_POOL_PLURAL,
        short_name="epool",  # not `ep`: Endpoints has it
        columns=[
            column("Model", "string", ".spec.model.servedName", "Name the servers serve the base model under."),
            condition_column(READY),
            column("Desired", "integer", ".spec.engine.replicas", "Servers wanted."),
            column("Available", "integer", ".status.readyReplicas", "Servers ready."),
            column("Runs", "string", ".status.runs", "TrainingRuns on the pool.", priority=1),
            column("Phase", "string", ".status.phase", "Summary of the conditions.", priority=1),
            AGE,
        ],
    ),
)


def root_schema(kind: Kind) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "description": (kind.resource.__doc__ or "").strip(),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "API version: harnessrl.io/v1alpha1."},
            "kind": {"type": "string", "description": f"Resource kind: {kind.kind}."},
            "metadata": {"type": "object"},
            "spec": structural_schema(kind.spec),
            "status": structural_schema(kind.status),
        },
    }
    if kind.resource.rules:
        schema["x-kubernetes-validations"] = [rule.schema() for rule in kind.resource.rules]
    return schema


def crd(kind: Kind) -> dict[str, Any]:
    """The CustomResourceDefinition of `kind`; raises ValueError if its schema is not structural."""
    schema = root_schema(kind)
    errors = structural_errors(schema)
    if errors:
        raise ValueError(f"{kind.kind} schema is not structural:\n" + "\n".join(errors))
    subresources: dict[str, Any] = {"status": {}}
    if kind.scale:
        subresources["scale"] = {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.name, "labels": {"app.kubernetes.io/part-of": "harnessrl"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.kind.lower(),
                "shortNames": [kind.short_name],
                "categories": CATEGORIES,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": subresources,
                    "additionalPrinterColumns": kind.columns,
                }
            ],
        },
    }


def all_crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD, for every kind."""
    return {f"{kind.name}.yaml": crd(kind) for kind in KINDS}
