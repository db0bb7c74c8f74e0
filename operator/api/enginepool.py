"""The EnginePool resource: vLLM servers that several LoRA TrainingRuns on one base model share.

A platform team writes the pool (image, model, server count and size, how many adapters fit); a team's run names
it in `spec.engine.pool` and brings only its adapter. Each run's learner loads its policy under the run's own
name, each run's proxy samples only that adapter, and a run that finishes unloads its own."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Final, Literal

from harnessrl.operator.api.common import (
    API_VERSION,
    ApiModel,
    ObjectMeta,
    PodOverrides,
    ResourceName,
    name_rule,
    queue_name_field,
)
from harnessrl.operator.api.status import Conditions, conditions_field, kopf_field
from harnessrl.operator.api.trainingrun import EngineServers, ServedModel
from pydantic import Field

KIND: Final = "EnginePool"
PLURAL = "enginepools"


class PoolLora(ApiModel):
    """The adapters the servers hold."""

    max_rank: int = Field(
        default=64, ge=1, le=512, description="Largest LoRA rank a run on the pool may train (vLLM's --max-lora-rank, "
        "rounded up to a rank vLLM supports)."
    )
    max_loras: int = Field(
        default=8,
        ge=1,
        le=64,
        description="Adapters one batch can mix (vLLM's --max-loras): about two per run sampling at once, since a "
        "run keeps its previous versions loaded while calls still name them.",
    )


class EnginePoolSpec(ApiModel):
    """Desired state of an EnginePool."""

    model: ServedModel = Field(description="Base weights the servers serve; runs on the pool must train on them.")
    engine: EngineServers = Field(default_factory=EngineServers, description="The vLLM servers.")
    lora: PoolLora = Field(default_factory=PoolLora, description="Adapter capacity.")
    pod: PodOverrides = Field(default_factory=PodOverrides, description="Scheduling settings of the server Pods.")
    queue_name: ResourceName | None = queue_name_field(KIND, "the pool's servers as one Workload (one pod set, `engine`)")


class PoolUsage(ApiModel):
    """What the pool's servers consumed so far, for chargeback (also Prometheus `harnessrl_enginepool_gpu_seconds`).
    The runs on the pool count none of it in their own usage; their tokensSampled is the share each drew."""

    gpu_seconds: Annotated[float, Field(ge=0)] = Field(
        default=0.0, description="GPUs requested by the running servers times their running time, summed."
    )
    # JSON carries times as strings; strict typing would refuse them.
    observed_time: datetime | None = Field(default=None, description="Until when gpuSeconds is counted.", strict=False)


class EnginePoolStatus(ApiModel):
    """Observed state of an EnginePool, written by the operator."""

    phase: Literal["Pending", "Ready", "Degraded"] | None = Field(
        default=None, description="Summary of the conditions."
    )
    observed_generation: int = Field(default=0, ge=0, description="metadata.generation last acted on.")
    conditions: Conditions = conditions_field("Ready.")
    ready_replicas: int = Field(default=0, ge=0, description="Servers that are ready.")
    runs: list[ResourceName] = Field(
        default_factory=list, max_length=1024, description="TrainingRuns that name this pool in spec.engine.pool."
    )
    usage: PoolUsage = Field(default_factory=PoolUsage, description="What the servers consumed (chargeback).")
    kopf: dict[str, Any] | None = kopf_field()


class EnginePool(ApiModel):
    """vLLM servers shared by LoRA TrainingRuns on one base model, one adapter per run."""

    rules = (name_rule(KIND),)

    api_version: Literal["harnessrl.io/v1alpha1"] = Field(
        default=API_VERSION, description="harnessrl.io/v1alpha1"
    )
    kind: Literal["EnginePool"] = Field(default=KIND, description="EnginePool")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: EnginePoolSpec = Field(description="Desired state.")
    status: EnginePoolStatus | None = Field(default=None, description="Observed state.")
