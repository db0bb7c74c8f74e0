"""The plan's types: a run's components and their parts, the EnginePool plan, and the errors that refuse a spec."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, TypeVar

from harnessrl.operator.api import reasons as R
from harnessrl.operator.api.common import PodOverrides, ResourceRequirements
from harnessrl.operator.api.enginepool import EnginePoolSpec
from harnessrl.operator.api.harnesspool import HarnessPoolSpec
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.runtime.contracts.engine_config import EngineConfig
from harnessrl.runtime.contracts.learner_config import LearnerConfig
from harnessrl.runtime.contracts.proxy_config import ProxyConfig
from harnessrl.runtime.contracts.runner_config import RunnerConfig
from pydantic import BaseModel, ConfigDict, Field

from harnessrl import __version__


class PlanError(ValueError):
    """The spec cannot be turned into components (a missing pool, a combination no component supports)."""

    reason = R.INVALID_SPEC


class TooManyPodSets(PlanError):
    reason = R.TOO_MANY_POD_SETS


class ContextTooLong(PlanError):
    """engine.maxModelLen exceeds the positions the model's own config allows."""

    reason = R.CONTEXT_TOO_LONG


class EnginePoolUnavailable(PlanError):
    """spec.engine.pool names an EnginePool that is missing or cannot serve the run."""

    reason = R.ENGINE_POOL_UNAVAILABLE


class ComponentKind(StrEnum):
    ENGINE = "engine"
    PROXY = "proxy"
    LEARNER = "learner"
    RUNNER = "runner"
    ENGINE_POOL = "enginepool"  # an EnginePool's servers


class PlanModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Port(PlanModel):
    name: str
    port: int = Field(ge=1, le=65535)


class SecretFile(PlanModel):
    """A Secret key the component reads as a file (never as a literal in its config or env)."""

    secret: str
    key: str
    path: str = Field(description="where the file appears for the component")


class AdapterStorePlan(PlanModel):
    """The sidecar beside each engine replica that receives LoRA adapters from the learner (engines in Pods do not
    see the learner's checkpoint volume; see runtime/engine/adapter_store.py)."""

    image: str
    port: int = Field(ge=1, le=65535)
    token: SecretFile = Field(description="the bearer token uploads must carry (the proxy admin token)")


class Images(PlanModel):
    """Where the operator's component images come from (`<registry>/<name>:<tag>`)."""

    registry: str = "ghcr.io/harnessrl"
    tag: str = __version__  # images are released with the package

    def image(self, name: str) -> str:
        return f"{self.registry}/{name}:{self.tag}"


class Component(PlanModel):
    """One component of a run: what runs, how many, with which config."""

    kind: ComponentKind
    name: str = Field(description="name of its children (StatefulSet, Service, ConfigMap, ...)")
    image: str
    replicas: int = Field(ge=0)
    gpus: int = Field(ge=0)
    resources: ResourceRequirements
    ports: list[Port]
    config: EngineConfig | ProxyConfig | LearnerConfig | RunnerConfig
    secrets: list[SecretFile] = Field(default_factory=list)
    pod: PodOverrides = Field(default_factory=PodOverrides)
    pool: str | None = None
    harness: str | None = None

    def config_json(self) -> dict[str, Any]:
        """The config as the component reads it (JSON types, no secrets: those are files)."""
        return self.config.model_dump(mode="json", exclude_none=True)


class EngineTarget(PlanModel):
    """The servers a run samples from and publishes its policy to: its own, or an EnginePool's."""

    urls: list[str]
    adapter_stores: list[str] = Field(description="the store beside each server, where servers have their own disks")
    store_token: SecretFile | None
    served_name: str = Field(description="the name the servers serve the base model under")
    adapter_prefix: str | None = Field(description="what the run's adapters are named after; None: the served name")
    api_key: SecretFile | None = Field(None, description="the key the servers require (an EnginePool's)")


class Plan(PlanModel):
    run: str
    namespace: str
    suspended: bool
    engine: Component | None = Field(description="the run's own servers; None on an EnginePool")
    engine_pool: str | None = Field(None, description="the EnginePool the run samples from")
    proxy: Component
    learner: Component
    runners: list[Component]
    adapter_store: AdapterStorePlan | None = Field(None, description="LoRA sync where engines have their own disks")
    proxy_admin_secret: str = Field(description="Secret holding the proxy admin token (generated once)")
    runner_token_secret: str = Field(description="Secret holding the runners' coordinator token (generated once)")
    checkpoint_claim: str | None = Field(description="user's PVC for checkpoints; None = the run's own")
    restart_budget: int = Field(ge=0)
    spec: TrainingRunSpec
    pools: dict[str, HarnessPoolSpec] = Field(description="every pool with runners: trained on or evaluated under")

    @property
    def scope_name(self) -> str:
        """What the children's names and labels carry (kube/common.py Scope)."""
        return self.run

    def components(self) -> list[Component]:
        return [c for c in (self.engine, self.proxy, self.learner, *self.runners) if c is not None]


class EnginePoolPlan(PlanModel):
    """An EnginePool's children: its servers with an adapter store beside each, and the stores' token Secret."""

    pool: str
    namespace: str
    engine: Component
    adapter_store: AdapterStorePlan
    spec: EnginePoolSpec
    suspended: bool = False  # a pool has no suspend: True only while Kueue has not admitted it (`stopped`)

    @property
    def scope_name(self) -> str:
        return self.pool


# What Kueue admits as one Workload, and what runs or stops as a whole: a run, or an EnginePool's servers.
Admissible = TypeVar("Admissible", Plan, EnginePoolPlan)
