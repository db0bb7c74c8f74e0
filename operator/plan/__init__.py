"""TrainingRun + its HarnessPools (+ EnginePool) -> Plan: the components of a run and their rendered configs;
EnginePool -> EnginePoolPlan: its servers. Pure.

The plan is computed once and realised two ways: `harnessrl.operator.kube` turns it into manifests, the
local runner (`harnessrl run`) into processes. What differs between the two (URLs, ports, paths inside the
container or under a run directory) is a `Placement`; everything else (which components, their configs,
replicas, resources, images) is decided here, from the spec alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any, TypeVar

import yaml
from harnessrl.operator.api import reasons as R
from harnessrl.operator.api.common import (
    COMPONENT_LABEL,
    ENGINE_POOL_LABEL,
    POOL_LABEL,
    RUN_LABEL,
    PodOverrides,
    ResourceRequirements,
    SecretKeyRef,
)
from harnessrl.operator.api.enginepool import EnginePoolSpec
from harnessrl.operator.api.harnesspool import HarnessPoolSpec
from harnessrl.operator.api.trainingrun import EngineServers, ServedModel, TrainingRunSpec
from harnessrl.runtime.contracts import learner_config as learner_cfg
from harnessrl.runtime.contracts import runner_config as runner_cfg
from harnessrl.runtime.contracts.coordinator import PoolHarness
from harnessrl.runtime.contracts.engine_config import API_KEY_ENV, EngineConfig, LoraSettings
from harnessrl.runtime.contracts.harness_versions import pin
from harnessrl.runtime.contracts.learner_config import LearnerConfig
from harnessrl.runtime.contracts.learner_memory import (
    GIB,
    KNOWN_SHAPES,
    MemoryPlan,
    ModelShape,
    TrainingSetup,
    fits,
    plan_memory,
)
from harnessrl.runtime.contracts.proxy_config import AdmissionLimits, ProxyConfig, worker_ports
from harnessrl.runtime.contracts.runner_config import RunnerConfig
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harnessrl import __version__

# vLLM accepts only these LoRA ranks for --max-lora-rank; the engine serves the smallest one that fits.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The API spells dialects as in its docs (kebab-case), the runner as Python identifiers.
RUNNER_DIALECT: dict[str, runner_cfg.Dialect] = {
    "openai-chat": "openai_chat",
    "openai-responses": "openai_responses",
    "anthropic": "anthropic",
    "gemini": "gemini",
}


# Full-weight sync over vLLM's weight-transfer API (runtime/learner/sync.py): what the engines need for it.
NCCL_ENGINE_ARGS = ["--weight-transfer-config", '{"backend":"nccl"}']
NCCL_ENGINE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
NCCL_PORT = 29551
POD_IP_ENV = "POD_IP"  # a Pod's own IP, from the downward API (status.podIP)
# The longest sequence the memory plan assumes when engine.maxModelLen is empty (Qwen3's native context).
DEFAULT_CONTEXT_TOKENS = 32768
ADAPTER_STORE_PORT = 8001
MAX_POD_SETS = 8  # Kueue's limit on a Workload's spec.podSets: learner, engine, proxy and one per pool


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


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Port(_Model):
    name: str
    port: int = Field(ge=1, le=65535)


class SecretFile(_Model):
    """A Secret key the component reads as a file (never as a literal in its config or env)."""

    secret: str
    key: str
    path: str = Field(description="where the file appears for the component")


class AdapterStorePlan(_Model):
    """The sidecar beside each engine replica that receives LoRA adapters from the learner (engines in Pods do not
    see the learner's checkpoint volume; see runtime/engine/adapter_store.py)."""

    image: str
    port: int = Field(ge=1, le=65535)
    token: SecretFile = Field(description="the bearer token uploads must carry (the proxy admin token)")


class Images(_Model):
    """Where the operator's component images come from (`<registry>/<name>:<tag>`)."""

    registry: str = "ghcr.io/harnessrl"
    tag: str = __version__  # images are released with the package

    def image(self, name: str) -> str:
        return f"{self.registry}/{name}:{self.tag}"


class Placement(ABC):
    """Where components find each other and their files: in a cluster, or on one machine."""

    engine_port: int = 8000
    proxy_port: int = 8080
    learner_port: int = 8090
    runner_metrics_port: int | None = None  # where runners serve /metrics; None: they do not
    # Whether whoever runs the engines here restarts them on each policy the learner publishes (weightSync restart).
    restarts_engines: bool = False
    # The variable that holds a component's own IP (a Pod's), for what must bind an address of its own (the
    # learner's NCCL rendezvous); None: components run on loopback.
    own_address_env: str | None = None

    @abstractmethod
    def engine_url(self, run: str, replica: int) -> str:
        """Base URL (no /v1) of one engine replica: the learner hot-loads weights into each one."""

    @abstractmethod
    def proxy_url(self, run: str) -> str:
        """Base URL of the proxy (any replica: POST /sessions answers with the owning replica's URL)."""

    @abstractmethod
    def coordinator_url(self, run: str) -> str:
        """Base URL of the learner's coordinator."""

    @abstractmethod
    def path(self, what: str) -> str:
        """A file or directory the components use; `what` is one of PATHS."""

    def adapter_store_url(self, run: str, replica: int) -> str | None:
        """Where the learner uploads adapters for an engine replica; None where engines read the learner's files."""
        return None

    def proxy_replica_urls(self, run: str, replicas: int) -> list[str]:
        """Each proxy replica's own base URL, for what must reach every replica (the policy: each serves its own
        sessions); empty where one proxy process serves at `proxy_url`."""
        return []


# Names of the files and directories a Placement locates.
PATHS = (
    "config",  # the component's rendered config file
    "proxy-admin-token",  # the proxy's admin bearer token (a Secret)
    "runner-token",  # the runners' credential at the coordinator (a Secret)
    "hub-token",  # the Hub token of the export (a Secret)
    "base-model-token",  # a Hub token that reads a gated or private base model (a Secret)
    "tasks-token",  # a Hub token that reads a gated or private task dataset (a Secret)
    "e2b-api-key",  # the E2B API key of an e2b-sandbox pool (a Secret)
    "wandb-api-key",  # the W&B API key of spec.tracking.wandb (a Secret)
    "mlflow-tracking-uri",  # the MLflow tracking URI of spec.tracking.mlflow (a Secret)
    "mlflow-token",  # its bearer token (a Secret)
    "trackio-token",  # the Hugging Face token trackio writes to its Space with (a Secret)
    "journal",  # the proxy's journal directory
    "checkpoints",  # the learner's checkpoint directory
    "base-model",  # base weights the learner trains on
    "tasks",  # the task set, for runners
    "task-ids",  # the task ids of the trained split, for the learner
    "adapter-store-token",  # an EnginePool's adapter store token (a Secret)
    "engine-api-key",  # the API key an EnginePool's vLLM servers require (a Secret)
    "engine-env",  # a directory per engine variable whose value is a Secret: <dir>/<NAME>/value
)


def eval_task_ids_file(task_ids_file: str) -> str:
    """Where the eval split's task ids go: beside the trained split's (the same volume in a Pod)."""
    return str(PurePosixPath(task_ids_file).with_name("eval-ids.txt"))


def validation_task_ids_file(task_ids_file: str) -> str:
    """Where the validation split's task ids go (spec.eval.validationSplit), beside the others."""
    return str(PurePosixPath(task_ids_file).with_name("validation-ids.txt"))


class ClusterPlacement(Placement):
    """Components in Pods: Services by DNS, files at fixed paths in the containers."""

    runner_metrics_port = 9102  # scraped by the chart's PodMonitor
    own_address_env = POD_IP_ENV  # the downward API's status.podIP (kube/learner.py)

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def engine_url(self, run: str, replica: int) -> str:
        return self._server_url(child_name(run, ComponentKind.ENGINE), replica, self.engine_port)

    def _server_url(self, statefulset: str, replica: int, port: int) -> str:
        # Each StatefulSet Pod has a stable DNS name under the headless Service of the same name.
        return f"http://{statefulset}-{replica}.{statefulset}.{self.namespace}.svc:{port}"

    def proxy_url(self, run: str) -> str:
        return f"http://{run}-proxy.{self.namespace}.svc:{self.proxy_port}"

    def proxy_replica_url(self, run: str, pod: str) -> str:
        """A proxy replica's own base URL: its StatefulSet Pod's DNS name under the proxy's headless Service (what
        `POST /sessions` answers with, and where the learner sets the policy)."""
        return f"http://{pod}.{proxy_headless_name(run)}.{self.namespace}.svc:{self.proxy_port}"

    def proxy_replica_urls(self, run: str, replicas: int) -> list[str]:
        return [self.proxy_replica_url(run, f"{child_name(run, ComponentKind.PROXY)}-{i}") for i in range(replicas)]

    def coordinator_url(self, run: str) -> str:
        return f"http://{run}-learner.{self.namespace}.svc:{self.learner_port}"

    def path(self, what: str) -> str:
        return CLUSTER_PATHS[what]

    def adapter_store_url(self, run: str, replica: int) -> str | None:
        return self._server_url(child_name(run, ComponentKind.ENGINE), replica, ADAPTER_STORE_PORT)

    def engine_pool_urls(self, pool: str, replica: int) -> tuple[str, str]:
        """(server, adapter store) base URLs of one server of an EnginePool."""
        name = child_name(pool, ComponentKind.ENGINE_POOL)
        return self._server_url(name, replica, self.engine_port), self._server_url(name, replica, ADAPTER_STORE_PORT)


CLUSTER_PATHS: dict[str, str] = {
    "config": "/etc/harnessrl/config.yaml",
    "proxy-admin-token": "/var/run/secrets/harnessrl/proxy-admin/token",
    "runner-token": "/var/run/secrets/harnessrl/runner/token",
    "hub-token": "/var/run/secrets/harnessrl/hub/token",
    "base-model-token": "/var/run/secrets/harnessrl/base-model-token/token",
    "tasks-token": "/var/run/secrets/harnessrl/tasks-token/token",
    "e2b-api-key": "/var/run/secrets/harnessrl/e2b/api-key",
    "wandb-api-key": "/var/run/secrets/harnessrl/wandb/api-key",
    "mlflow-tracking-uri": "/var/run/secrets/harnessrl/mlflow-uri/uri",
    "mlflow-token": "/var/run/secrets/harnessrl/mlflow-token/token",
    "trackio-token": "/var/run/secrets/harnessrl/trackio/token",
    "journal": "/var/lib/harnessrl/journal",
    "checkpoints": "/var/lib/harnessrl/checkpoints",
    "base-model": "/var/lib/harnessrl/model",
    "tasks": "/var/lib/harnessrl/tasks",
    "task-ids": "/var/lib/harnessrl/task-ids/ids.txt",
    "adapter-store-token": "/var/run/secrets/harnessrl/adapter-store/token",
    "engine-api-key": "/var/run/secrets/harnessrl/engine-api-key/token",
    "engine-env": "/var/run/secrets/harnessrl/engine-env",
}
assert set(CLUSTER_PATHS) == set(PATHS)


class Component(_Model):
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


class EngineTarget(_Model):
    """The servers a run samples from and publishes its policy to: its own, or an EnginePool's."""

    urls: list[str]
    adapter_stores: list[str] = Field(description="the store beside each server, where servers have their own disks")
    store_token: SecretFile | None
    served_name: str = Field(description="the name the servers serve the base model under")
    adapter_prefix: str | None = Field(description="what the run's adapters are named after; None: the served name")
    api_key: SecretFile | None = Field(None, description="the key the servers require (an EnginePool's)")


class Plan(_Model):
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


class EnginePoolPlan(_Model):
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


def child_name(run: str, component: ComponentKind, pool: str | None = None) -> str:
    """Deterministic names: `<run>-engine`, `<run>-proxy`, `<run>-learner`, `<run>-<pool>-runner`."""
    return f"{run}-{pool}-{component}" if pool else f"{run}-{component}"


def runner_token_secret(run: str) -> str:
    """The Secret of the run's runner credential: runners send it, the learner's coordinator checks it."""
    return f"{run}-runner-token"


def runner_token_file(placement: Placement, run: str) -> SecretFile:
    return SecretFile(secret=runner_token_secret(run), key="token", path=placement.path("runner-token"))


def engine_pool_store_secret(pool: str) -> str:
    """The Secret of an EnginePool's adapter-store token: its runs' learners upload with it."""
    return f"{child_name(pool, ComponentKind.ENGINE_POOL)}-store"


def engine_pool_api_key_secret(pool: str) -> str:
    """The Secret of the API key an EnginePool's vLLM servers require (runtime/engine/api_key.py)."""
    return f"{child_name(pool, ComponentKind.ENGINE_POOL)}-api-key"


def engine_pool_api_key(placement: Placement, pool: str) -> SecretFile:
    return SecretFile(secret=engine_pool_api_key_secret(pool), key="token", path=placement.path("engine-api-key"))


def run_store_secret(run: str) -> str:
    """The Secret of a run's own credential at its EnginePool's adapter stores (it writes only the run's adapters:
    runtime/engine/adapter_store.py), derived by the operator from the pool's store token."""
    return f"{run}-adapter-store"


def proxy_headless_name(run: str) -> str:
    """The proxy's headless Service, which gives each replica its stable DNS name (`<run>-proxy` is the Service
    that reaches any replica)."""
    return f"{child_name(run, ComponentKind.PROXY)}-headless"


def build_plan(
    run: str,
    namespace: str,
    spec: TrainingRunSpec,
    pools: dict[str, HarnessPoolSpec],
    placement: Placement,
    images: Images | None = None,
    engine_pool: EnginePoolSpec | None = None,
) -> Plan:
    """The components of `run`. `pools` must hold every pool `spec.harnesses` and `spec.eval` name, and
    `engine_pool` the EnginePool `spec.engine.pool` names (None: it does not exist)."""
    try:
        return _build(run, namespace, spec, pools, placement, images or Images(), engine_pool)
    except ValidationError as exc:
        # A combination the API allows but a component's config does not (e.g. image tasks, local sandbox).
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise PlanError(f"{exc.title} for run {run}: {problems}") from exc


def _build(
    run: str, namespace: str, spec: TrainingRunSpec, pools: dict[str, HarnessPoolSpec], placement: Placement,
    images: Images, engine_pool: EnginePoolSpec | None,
) -> Plan:
    missing = sorted(name for name in pool_names(spec) if name not in pools)
    if missing:
        raise PlanError(f"HarnessPool {', '.join(missing)} not found in namespace {namespace}")
    used = {name: pools[name] for name in pool_names(spec)}
    too_long = sorted(name for name in used if len(name) > 63)
    if too_long:
        raise PlanError(f"HarnessPool name {', '.join(too_long)} is longer than 63 characters: it labels runner Pods")
    own = 2 if spec.engine.pool else 3  # learner, proxy (and engine)
    if spec.queue_name and own + len(used) > MAX_POD_SETS:
        raise TooManyPodSets(f"spec.queueName: a Kueue Workload holds at most {MAX_POD_SETS} pod sets, and this run has "
                             f"{own + len(used)} ({own} of its own and {len(used)} pools): use at most "
                             f"{MAX_POD_SETS - own} pools in a queued run")
    if spec.engine.pool is not None and engine_pool is not None:
        # The pool's servers set the context length that the memory plan and Dr. GRPO's constant assume.
        engine = spec.engine.model_copy(update={"max_model_len": engine_pool.engine.max_model_len})
        spec = spec.model_copy(update={"engine": engine})
    admin_secret = child_name(run, ComponentKind.PROXY) + "-admin"
    adapter_store = _adapter_store(run, spec, placement, images, admin_secret)
    target = _engine_target(run, namespace, spec, placement, adapter_store, engine_pool)
    return Plan(
        run=run,
        namespace=namespace,
        suspended=spec.suspend,
        engine=_engine(run, spec, placement),
        engine_pool=spec.engine.pool,
        adapter_store=adapter_store,
        proxy=_proxy(run, spec, placement, images, admin_secret, target),
        learner=_learner(run, spec, used, placement, images, admin_secret, target),
        runners=[_runner(run, namespace, spec, name, pool, placement, images) for name, pool in used.items()],
        proxy_admin_secret=admin_secret,
        runner_token_secret=runner_token_secret(run),
        checkpoint_claim=spec.learner.checkpoint_claim_name,
        restart_budget=spec.learner.restart_budget,
        spec=spec,
        pools=used,
    )


def stopped(plan: Admissible) -> Admissible:
    """The plan with no Pod running (a suspended run, or a run or pool Kueue has not admitted): its workloads at
    zero replicas and a run's learner Job suspended (kube/common.py running_replicas). Configs stay as they are."""
    return plan.model_copy(update={"suspended": True})


def pool_share(total: int, users: set[str], run: str) -> int:
    """The runner replicas `run` gets of a pool's `total`, split evenly among the runs using it (the first runs by
    name get one more where it does not divide), so that the pool's replicas, its scale subresource and an HPA on
    it count runners across all of them instead of multiplying by the number of runs. A pool with fewer replicas
    than runs still gives each run one (none starves); a pool scaled to zero gives none."""
    ordered = sorted(users | {run})
    share = total // len(ordered) + (1 if ordered.index(run) < total % len(ordered) else 0)
    return max(share, 1) if total > 0 else 0


def eval_pool_names(spec: TrainingRunSpec) -> list[str]:
    """The pools evaluated under: spec.eval.harnesses, else every trained pool; none without spec.eval."""
    if spec.eval is None:
        return []
    return list(spec.eval.harnesses) or [ref.pool for ref in spec.harnesses]


def pool_names(spec: TrainingRunSpec) -> list[str]:
    """Every pool the run needs runners of: the trained ones, then eval-only ones."""
    return list(dict.fromkeys([*(ref.pool for ref in spec.harnesses), *eval_pool_names(spec)]))


def harness_name(pool: HarnessPoolSpec) -> str:
    known, custom = pool.harness.known, pool.harness.custom
    return known.name if known is not None else custom.name  # type: ignore[union-attr]


def _engine(run: str, spec: TrainingRunSpec, placement: Placement) -> Component | None:
    engine, model = spec.engine, spec.model
    if engine.pool is not None:
        return None
    if engine.weight_sync == "restart" and not placement.restarts_engines:
        # Engine Pods cannot read the learner's checkpoint volume, and nothing would restart them on new weights.
        raise PlanError("engine.weightSync restart runs only in `harnessrl run`; in a cluster use lora (with "
                        "model.adapter.lora) or nccl (full weights on GPUs)")
    lora = model.adapter.lora
    return engine_servers(
        child_name(run, ComponentKind.ENGINE), ComponentKind.ENGINE, engine, model, placement,
        LoraSettings(enabled=engine.weight_sync == "lora", max_rank=_lora_rank(lora.rank if lora else 16)),
        spec.pod, nccl=engine.weight_sync == "nccl",
    )


def engine_servers(
    name: str,
    kind: ComponentKind,
    servers: EngineServers,
    model: ServedModel,
    placement: Placement,
    lora: LoraSettings,
    pod: PodOverrides,
    nccl: bool = False,
) -> Component:
    """vLLM servers of `model`: a run's own, or an EnginePool's."""
    hub = model.base.hub
    # vLLM downloads a Hub base model itself: a gated one needs the token.
    token = _secret(hub.token_secret, placement.path("base-model-token")) if hub and hub.token_secret else None
    if hub is not None:
        # A revision other than main is passed through.
        source, revision = hub.repo, ([] if hub.revision == "main" else ["--revision", hub.revision])
    else:
        source, revision = placement.path("base-model"), []
    # Variables from Secrets become files the launcher reads (`harnessrl run`) or the Secrets a Pod's env names.
    env_files = {e.name: SecretFile(secret=e.value_from.secret_key_ref.name, key=e.value_from.secret_key_ref.key,
                                    path=f"{placement.path('engine-env')}/{e.name}/value")
                 for e in servers.env if e.value_from is not None}
    literal = {e.name: e.value for e in servers.env if e.value_from is None}
    shape = known_shape(model)
    check_context(servers, shape.max_positions if shape else None, f"{source}'s config")
    config = EngineConfig(
        model=source,
        served_model_name=model.served_name,
        device="cuda" if servers.gpus else "cpu",
        dtype=model.dtype,
        tensor_parallel_size=max(servers.gpus, 1),
        gpu_memory_utilization=servers.gpu_memory_utilization if servers.gpus else None,
        lora=lora,
        host="0.0.0.0",
        port=placement.engine_port,
        extra_args=[*revision, *NCCL_ENGINE_ARGS, *servers.args] if nccl else [*revision, *servers.args],
        env=(NCCL_ENGINE_ENV if nccl else {}) | literal | hub_token_env(token.path if token else None),
        secret_env={name: f.path for name, f in env_files.items()},
        **({"max_model_len": servers.max_model_len} if servers.max_model_len else {}),
    )
    return Component(
        kind=kind,
        name=name,
        image=servers.image,
        replicas=servers.replicas,
        gpus=servers.gpus,
        resources=servers.resources,
        ports=[Port(name="http", port=placement.engine_port)],
        config=config,
        secrets=[*([token] if token else []), *env_files.values()],
        pod=pod,
    )


def build_engine_pool_plan(
    pool: str, namespace: str, spec: EnginePoolSpec, placement: Placement, images: Images | None = None
) -> EnginePoolPlan:
    """An EnginePool's servers: LoRA always on, an adapter store beside each (its runs' learners upload there)."""
    lora = LoraSettings(enabled=True, max_rank=_lora_rank(spec.lora.max_rank), max_loras=spec.lora.max_loras)
    engine = engine_servers(child_name(pool, ComponentKind.ENGINE_POOL), ComponentKind.ENGINE_POOL, spec.engine,
                            spec.model, placement, lora, spec.pod)
    engine = _requiring_key(engine, engine_pool_api_key(placement, pool))
    token = SecretFile(secret=engine_pool_store_secret(pool), key="token", path=placement.path("adapter-store-token"))
    store = AdapterStorePlan(image=(images or Images()).image("proxy"), port=ADAPTER_STORE_PORT, token=token)
    return EnginePoolPlan(pool=pool, namespace=namespace, engine=engine, adapter_store=store, spec=spec)


def _requiring_key(engine: Component, key: SecretFile) -> Component:
    """The servers with vLLM's API key set from `key` (a pool's own, over any VLLM_API_KEY of spec.engine.env)."""
    assert isinstance(engine.config, EngineConfig)
    config = engine.config.model_copy(update={"secret_env": engine.config.secret_env | {API_KEY_ENV: key.path}})
    secrets = [s for s in engine.secrets if s.path != engine.config.secret_env.get(API_KEY_ENV)]
    return engine.model_copy(update={"config": config, "secrets": [*secrets, key]})


def _adapter_store(
    run: str, spec: TrainingRunSpec, placement: Placement, images: Images, admin_secret: str
) -> AdapterStorePlan | None:
    if spec.engine.pool is not None or spec.engine.weight_sync != "lora" or placement.adapter_store_url(run, 0) is None:
        return None
    token = SecretFile(secret=admin_secret, key="token", path=placement.path("proxy-admin-token"))
    return AdapterStorePlan(image=images.image("proxy"), port=ADAPTER_STORE_PORT, token=token)


def _engine_target(
    run: str,
    namespace: str,
    spec: TrainingRunSpec,
    placement: Placement,
    adapter_store: AdapterStorePlan | None,
    engine_pool: EnginePoolSpec | None,
) -> EngineTarget:
    name = spec.engine.pool
    if name is None:
        replicas = range(spec.engine.replicas)
        return EngineTarget(
            urls=[placement.engine_url(run, i) for i in replicas],
            # Where the engines cannot read the learner's files, each adapter goes through its engine's store first.
            adapter_stores=[placement.adapter_store_url(run, i) or "" for i in replicas] if adapter_store else [],
            store_token=adapter_store.token if adapter_store else None,
            served_name=spec.model.served_name,
            adapter_prefix=None,
        )
    if not isinstance(placement, ClusterPlacement):
        raise PlanError(f"engine.pool names EnginePool {name}, and only a cluster has EnginePools: remove "
                        "engine.pool to run the run's own engine")
    if engine_pool is None:
        raise EnginePoolUnavailable(f"EnginePool {name} not found in namespace {namespace}")
    if engine_pool.model.base != spec.model.base:
        raise EnginePoolUnavailable(f"EnginePool {name} serves another base model than this run's model.base: a run "
                                    "trains on the pool's base (spec.model.base of both must be equal)")
    lora = spec.model.adapter.lora
    if lora is not None and lora.rank > engine_pool.lora.max_rank:
        raise EnginePoolUnavailable(f"model.adapter.lora.rank {lora.rank} is above EnginePool {name}'s "
                                    f"lora.maxRank {engine_pool.lora.max_rank}")
    urls = [placement.engine_pool_urls(name, i) for i in range(engine_pool.engine.replicas)]
    return EngineTarget(
        urls=[server for server, _ in urls],
        adapter_stores=[store for _, store in urls],
        store_token=SecretFile(secret=run_store_secret(run), key="token", path=placement.path("adapter-store-token")),
        api_key=engine_pool_api_key(placement, name),
        served_name=engine_pool.model.served_name,
        # Unique among the pool's runs: they share its namespace.
        adapter_prefix=run,
    )


def _lora_rank(rank: int) -> Any:
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise PlanError(f"model.adapter.lora.rank {rank} is above vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}")
    return fitting[0]


def _proxy(
    run: str, spec: TrainingRunSpec, placement: Placement, images: Images, admin_secret: str, target: EngineTarget
) -> Component:
    config = ProxyConfig(
        host="0.0.0.0",
        port=placement.proxy_port,
        upstream_urls=target.urls,
        served_model=target.served_name,
        admin_token_file=placement.path("proxy-admin-token"),
        runner_token_file=placement.path("runner-token"),
        engine_api_key_file=target.api_key.path if target.api_key else None,
        journal_dir=placement.path("journal"),
        call_budget_default=spec.proxy.call_budget,
        max_tokens_per_call=spec.proxy.max_tokens_per_call,
        temperature=spec.grpo.temperature,
        sampling_seed=spec.grpo.seed if spec.grpo.seeded_sampling else None,
        # Each worker holds its own sessions: the replica's limit is split evenly over them.
        admission=AdmissionLimits(max_sessions=-(-spec.proxy.max_sessions_per_replica // spec.proxy.workers)),
        workers=spec.proxy.workers,
        journal_fsync=spec.proxy.journal_fsync,
        journal_commit_delay_s=spec.proxy.journal_commit_delay_milliseconds / 1000,
    )
    return Component(
        kind=ComponentKind.PROXY,
        name=child_name(run, ComponentKind.PROXY),
        image=images.image("proxy"),
        replicas=spec.proxy.replicas,
        gpus=0,
        resources=spec.proxy.resources,
        ports=[
            Port(name="http", port=placement.proxy_port),
            *(Port(name=f"worker-{k}", port=port)
              for k, port in enumerate(worker_ports(placement.proxy_port, spec.proxy.workers))),
        ],
        config=config,
        secrets=[SecretFile(secret=admin_secret, key="token", path=placement.path("proxy-admin-token")),
                 runner_token_file(placement, run), *([target.api_key] if target.api_key else [])],
        pod=_engine_client_pod(spec),
    )


def _engine_client_pod(spec: TrainingRunSpec) -> PodOverrides:
    """The run's pod overrides; on an EnginePool, with the label its NetworkPolicy admits (proxy and learner)."""
    if spec.engine.pool is None:
        return spec.pod
    return spec.pod.model_copy(update={"labels": {**spec.pod.labels, ENGINE_POOL_LABEL: spec.engine.pool}})


def _learner(
    run: str,
    spec: TrainingRunSpec,
    pools: dict[str, HarnessPoolSpec],
    placement: Placement,
    images: Images,
    admin_secret: str,
    target: EngineTarget,
) -> Component:
    grpo, learner, model = spec.grpo, spec.learner, spec.model
    if spec.engine.weight_sync == "nccl" and (learner.gpus > 1 or learner.nodes > 1):
        # The NCCL transfer sends one process's whole weights; a sharded (FSDP2) learner has only its shards.
        raise PlanError(f"engine.weightSync nccl needs a learner on one GPU, not learner.gpus {learner.gpus} × "
                        f"learner.nodes {learner.nodes}: use one GPU, or weightSync lora with model.adapter.lora")
    check_learner_memory(spec)
    lora = model.adapter.lora
    adapter = (
        learner_cfg.AdapterConfig(
            kind="lora", rank=lora.rank, alpha=float(lora.alpha), dropout=lora.dropout, target_modules=lora.target_modules
        )
        if lora is not None
        else learner_cfg.AdapterConfig(kind="full")
    )
    secrets = [SecretFile(secret=admin_secret, key="token", path=placement.path("proxy-admin-token")),
               runner_token_file(placement, run), *hub_read_tokens(spec, placement)]
    if target.store_token is not None and target.store_token.secret != admin_secret:
        secrets.append(target.store_token)  # an EnginePool's stores take their own token
    if target.api_key is not None:
        secrets.append(target.api_key)
    export = None
    if spec.export is not None:
        secrets.append(_secret(spec.export.token_secret, placement.path("hub-token")))
        export = learner_cfg.HubExport(
            repo=spec.export.hub_repo,
            token_file=placement.path("hub-token"),
            # The API counts export intervals in steps, the learner in checkpoints; the API refuses a step
            # count that is not a multiple of checkpointEvery, so this is exact.
            every=spec.export.every_steps // learner.checkpoint_every,
            private=spec.export.private,
            endpoint=spec.export.endpoint,
            run_spec=yaml.safe_dump(spec.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False),
        )
    tracking, tracking_secrets = _tracking(spec, placement)
    secrets += tracking_secrets
    config = LearnerConfig(
        run_name=run,
        model=learner_cfg.ModelConfig(
            path=placement.path("base-model"),
            served_name=target.served_name,
            adapter_prefix=target.adapter_prefix,
            # The learner trains in bf16 or fp32; fp16 serving still trains in the learner's default.
            dtype="auto" if model.dtype == "float16" else model.dtype,
            device="cuda" if learner.gpus else "cpu",
            gradient_checkpointing=gradient_checkpointing(spec),
        ),
        adapter=adapter,
        grpo=learner_cfg.GrpoConfig(
            group_size=grpo.group_size,
            max_staleness=grpo.max_staleness,
            lr=grpo.learning_rate,
            clip_low=grpo.clip_low,
            clip_high=grpo.clip_high,
            steps=grpo.steps,
            groups_per_step=grpo.batch,
            seed=grpo.seed,
            max_grad_norm=grpo.max_grad_norm or None,
            max_tokens_per_step=grpo.max_tokens_per_step,
            micro_batch_tokens=learner.micro_batch_tokens,
            loss_type=grpo.loss_type,
            scale_rewards=grpo.scale_rewards,
            importance_sampling_level=grpo.importance_sampling_level,
            baseline=grpo.baseline,
            beta=grpo.beta,
            vllm_importance_sampling_correction=grpo.vllm_importance_sampling_correction,
            vllm_importance_sampling_mode=grpo.vllm_importance_sampling_mode,
            vllm_importance_sampling_clip_min=grpo.vllm_importance_sampling_clip_min,
            vllm_importance_sampling_clip_max=grpo.vllm_importance_sampling_clip_max,
            temperature=grpo.temperature,
            loss_balance=grpo.loss_balance,
            **({"dr_grpo_tokens": spec.engine.max_model_len} if spec.engine.max_model_len else {}),
        ),
        reward=learner_cfg.RewardConfig(bonus=spec.reward.bonus, scale=spec.reward.scale,
                                        tool_mismatch_penalty=spec.reward.tool_mismatch_penalty),
        harnesses=[
            learner_cfg.HarnessWeight(pool=ref.pool, harness=harness_name(pools[ref.pool]), weight=ref.weight)
            for ref in spec.harnesses
        ],
        tasks=learner_cfg.TaskSource(file=placement.path("task-ids"), split=spec.tasks.split),
        proxy=learner_cfg.ProxyLink(
            url=placement.proxy_url(run),
            replica_urls=placement.proxy_replica_urls(run, spec.proxy.replicas),
            admin_token_file=placement.path("proxy-admin-token"),
            worker_ports=worker_ports(placement.proxy_port, spec.proxy.workers),
        ),
        engine=learner_cfg.EngineLink(
            urls=target.urls,
            sync=learner_cfg.SyncMode(spec.engine.weight_sync),
            adapter_stores=target.adapter_stores,
            adapter_store_token_file=target.store_token.path if target.store_token else None,
            api_key_file=target.api_key.path if target.api_key else None,
            # The engines' workers join the learner's NCCL rendezvous at an address the learner owns (vLLM binds
            # it): its Pod's IP on a cluster (not the Service's ClusterIP), loopback on one machine.
            nccl_master_address="127.0.0.1",
            nccl_master_address_env=placement.own_address_env,
            nccl_master_port=NCCL_PORT,
        ),
        checkpoint=learner_cfg.CheckpointConfig(
            dir=placement.path("checkpoints"),
            every=learner.checkpoint_every,
            keep=learner.keep_checkpoints,
        ),
        export=export,
        eval=_eval(spec, pools, placement),
        tracking=tracking,
        host="0.0.0.0",
        port=placement.learner_port,
        runner_token_file=placement.path("runner-token"),
    )
    return Component(
        kind=ComponentKind.LEARNER,
        name=child_name(run, ComponentKind.LEARNER),
        image=images.image("learner"),
        replicas=learner.nodes,
        gpus=learner.gpus,
        resources=learner.resources,
        ports=[Port(name="http", port=placement.learner_port)]
        # One weight-transfer group per engine replica, each rendezvousing on its own port.
        + ([Port(name=f"nccl-{i}", port=NCCL_PORT + i) for i in range(spec.engine.replicas)]
           if spec.engine.weight_sync == "nccl" else []),
        config=config,
        secrets=secrets,
        pod=_engine_client_pod(spec),
    )


def _tracking(spec: TrainingRunSpec, placement: Placement) -> tuple[learner_cfg.TrackingConfig, list[SecretFile]]:
    """The learner's trackers, and the Secrets it reads their credentials from (as files)."""
    t = spec.tracking
    secrets: list[SecretFile] = []

    def file(ref: SecretKeyRef, what: str) -> str:
        secrets.append(_secret(ref, placement.path(what)))
        return placement.path(what)

    wandb: learner_cfg.WandbLink | None = None
    if t.wandb is not None:
        wandb = learner_cfg.WandbLink(api_key_file=file(t.wandb.api_key_secret, "wandb-api-key"), entity=t.wandb.entity,
                                      base_url=t.wandb.base_url)
    mlflow: learner_cfg.MlflowLink | None = None
    if t.mlflow is not None:
        token = t.mlflow.token_secret
        mlflow = learner_cfg.MlflowLink(tracking_uri_file=file(t.mlflow.tracking_uri_secret, "mlflow-tracking-uri"),
                                        token_file=file(token, "mlflow-token") if token is not None else None)
    trackio: learner_cfg.TrackioLink | None = None
    if t.trackio is not None:
        trackio = learner_cfg.TrackioLink(space_id=t.trackio.space_id,
                                          token_file=file(t.trackio.token_secret, "trackio-token"))
    config = learner_cfg.TrackingConfig(report_to=[name for name in t.report_to if name != "none"], project=t.project,
                                        wandb=wandb, mlflow=mlflow, trackio=trackio)
    return config, secrets


class LearnerMemoryError(PlanError):
    """The learner's memory plan does not fit its GPUs."""

    reason = R.LEARNER_MEMORY_TOO_SMALL


def memory_setup(spec: TrainingRunSpec, checkpointing: bool) -> TrainingSetup:
    lora = spec.model.adapter.lora
    return TrainingSetup(
        lora_rank=lora.rank if lora is not None else None,
        lora_targets=lora.target_modules if lora is not None else [],
        micro_batch_tokens=spec.learner.micro_batch_tokens,
        max_sequence_tokens=spec.engine.max_model_len or DEFAULT_CONTEXT_TOKENS,
        gradient_checkpointing=checkpointing,
        gpus=max(spec.learner.gpus, 1) * spec.learner.nodes,  # FSDP2 shards over every node's GPUs
        gpu_memory_bytes=spec.learner.gpu_memory_gib * GIB,
    )


def model_shape(spec: TrainingRunSpec) -> ModelShape | None:
    return known_shape(spec.model)


def known_shape(model: ServedModel) -> ModelShape | None:
    hub = model.base.hub
    return KNOWN_SHAPES.get(hub.repo) if hub is not None else None


# vLLM's own override for a context past the model's positions (it warns of NaNs and out-of-bounds reads).
ALLOW_LONG_CONTEXT_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


def check_context(servers: EngineServers, limit: int | None, source: str) -> None:
    """engine.maxModelLen against the longest sequence the model's config allows (runtime/contracts/learner_memory.py
    context_limit, as vLLM derives it: vLLM refuses to start past it); `limit` None: not known here."""
    wanted = servers.max_model_len
    override = any(e.name == ALLOW_LONG_CONTEXT_ENV and e.value_from is None and (e.value or "").lower() in ("1", "true")
                   for e in servers.env)
    if wanted is None or limit is None or wanted <= limit or override:
        return
    raise ContextTooLong(
        f"engine.maxModelLen {wanted} exceeds the {limit} positions {source} allows (max_position_embeddings and "
        f"its rope scaling, as vLLM reads them): vLLM would refuse to start. Set engine.maxModelLen to at most "
        f"{limit}, or serve a model whose config scales its rope to the length you need"
    )


def gradient_checkpointing(spec: TrainingRunSpec) -> bool:
    """learner.gradientCheckpointing; auto = on for a GPU learner unless its memory plan fits without it."""
    setting = spec.learner.gradient_checkpointing
    if setting != "auto":
        return setting == "on"
    if spec.learner.gpus == 0:
        return False
    shape = model_shape(spec)
    if shape is None:
        return True
    setup = memory_setup(spec, checkpointing=False)
    return not fits(plan_memory(shape, setup), setup)


def check_learner_memory(spec: TrainingRunSpec) -> MemoryPlan | None:
    """The learner's memory plan on its GPUs; raises LearnerMemoryError, with the numbers, if it cannot fit."""
    shape = model_shape(spec)
    if spec.learner.gpus == 0 or shape is None:
        return None
    setup = memory_setup(spec, gradient_checkpointing(spec))
    plan = plan_memory(shape, setup)
    if not fits(plan, setup):
        raise LearnerMemoryError(
            f"the learner needs about {plan.peak / GIB:.0f} GiB per GPU, more than learner.gpuMemoryGib "
            f"{spec.learner.gpu_memory_gib}: {plan.summary()}; lower learner.microBatchTokens or "
            "engine.maxModelLen, turn on learner.gradientCheckpointing, or add learner.gpus"
        )
    return plan


def _eval(spec: TrainingRunSpec, pools: dict[str, HarnessPoolSpec], placement: Placement) -> learner_cfg.EvalSchedule | None:
    if spec.eval is None:
        return None
    return learner_cfg.EvalSchedule(
        every_steps=spec.eval.every_steps,
        at_start=spec.eval.at_start,
        pools=[PoolHarness(pool=name, harness=harness_name(pools[name])) for name in eval_pool_names(spec)],
        tasks=learner_cfg.TaskSource(
            file=eval_task_ids_file(placement.path("task-ids")), split=spec.eval.split, shuffle=False
        ),
        validation=learner_cfg.TaskSource(
            file=validation_task_ids_file(placement.path("task-ids")), split=spec.eval.validation_split, shuffle=False
        ) if spec.eval.validation_split is not None else None,
        limit=spec.eval.limit,
        attempts=spec.eval.attempts,
    )


def _secret(ref: SecretKeyRef, path: str) -> SecretFile:
    return SecretFile(secret=ref.name, key=ref.key, path=path)


def hub_read_tokens(spec: TrainingRunSpec, placement: Placement, *which: str) -> list[SecretFile]:
    """The Hub tokens that read a gated base model ("base-model-token") and task dataset ("tasks-token"), as
    files; `which` narrows to some of them."""
    sources = {"base-model-token": spec.model.base.hub, "tasks-token": spec.tasks.hub}
    return [_secret(hub.token_secret, placement.path(what)) for what, hub in sources.items()
            if (not which or what in which) and hub is not None and hub.token_secret is not None]


def hub_token_env(token_file: str | None) -> dict[str, str]:
    """huggingface_hub (vLLM's and `hf download`'s) reads the token from the file HF_TOKEN_PATH names."""
    return {"HF_TOKEN_PATH": token_file} if token_file else {}


def sandbox_labels(run: str, pool: str) -> dict[str, str]:
    """Labels of a run's sandbox Pods: the NetworkPolicy that confines them selects on these."""
    return {RUN_LABEL: run, COMPONENT_LABEL: "sandbox", POOL_LABEL: pool}


def proxy_pod_labels(run: str) -> dict[str, str]:
    return {RUN_LABEL: run, COMPONENT_LABEL: str(ComponentKind.PROXY)}


def _runner(
    run: str,
    namespace: str,
    spec: TrainingRunSpec,
    name: str,
    pool: HarnessPoolSpec,
    placement: Placement,
    images: Images,
) -> Component:
    harness = harness_name(pool)
    known, custom = pool.harness.known, pool.harness.custom
    # Known harnesses run from their own image (runner + pinned CLI); custom ones from the runner base.
    image = images.image(f"harness-{harness}") if known is not None else images.image("harness-runner")
    harness_cfg: runner_cfg.KnownHarnessSpec | runner_cfg.CustomHarnessSpec
    if known is not None:
        if known.version is not None and known.version != pin(known.name).version:
            raise PlanError(
                f"HarnessPool {name}: {known.name} version {known.version} is not the pinned "
                f"{pin(known.name).version}; leave harness.known.version empty or use a custom harness"
            )
        harness_cfg = runner_cfg.KnownHarnessSpec(
            name=known.name,
            version=known.version,
            image=known.image,
            dialect=RUNNER_DIALECT[known.dialect] if known.dialect else None,
        )
    else:
        assert custom is not None
        harness_cfg = runner_cfg.CustomHarnessSpec(
            name=custom.name,
            command=custom.command,
            dialect=RUNNER_DIALECT[custom.dialect],
            image=custom.image,
            env={e.name: e.value for e in custom.env},
        )
    # The runner token (it opens the coordinator's lease routes and the proxy's session routes), and the Hub token
    # of a gated task dataset.
    secrets = [runner_token_file(placement, run), *hub_read_tokens(spec, placement, "tasks-token")]
    sandbox = _sandbox(run, namespace, name, pool, harness_cfg.image or image, placement, secrets,
                       spec.proxy.workers)
    config = RunnerConfig(
        pool=name,
        harness=harness_cfg,
        sandbox=sandbox,
        tasks=_runner_tasks(spec, placement),
        concurrency=pool.concurrency,
        timeouts=runner_cfg.Timeouts(harness_s=pool.timeouts.harness_seconds, grader_s=pool.timeouts.grader_seconds),
        step_budget=pool.step_budget,
        coordinator_url=placement.coordinator_url(run),
        proxy_url=placement.proxy_url(run),
        runner_token_file=placement.path("runner-token"),
        model=spec.model.served_name,
        metrics_port=placement.runner_metrics_port,
    )
    return Component(
        kind=ComponentKind.RUNNER,
        name=child_name(run, ComponentKind.RUNNER, name),
        image=image,
        replicas=pool.replicas,
        gpus=0,
        resources=pool.resources,
        ports=[Port(name="metrics", port=config.metrics_port)] if config.metrics_port else [],
        config=config,
        secrets=secrets,
        pod=_merge_pod(spec.pod, pool.pod),
        pool=name,
        harness=harness,
    )


def _sandbox(
    run: str,
    namespace: str,
    name: str,
    pool: HarnessPoolSpec,
    image: str,
    placement: Placement,
    secrets: list[SecretFile],
    proxy_workers: int,
) -> runner_cfg.LocalSandboxConfig | runner_cfg.KubernetesSandboxConfig | runner_cfg.E2BSandboxConfig:
    box = pool.sandbox
    if box.local is not None:
        return runner_cfg.LocalSandboxConfig(
            cpu_seconds=box.local.cpu_seconds, memory_mb=box.local.memory_mib, network=box.local.network,
            allow_unisolated=box.local.allow_unisolated,
        )
    if box.e2b is not None:
        secrets.append(_secret(box.e2b.api_key_secret, placement.path("e2b-api-key")))
        return runner_cfg.E2BSandboxConfig(
            template=box.e2b.template,
            api_key_file=placement.path("e2b-api-key"),
            proxy_public_url=box.e2b.proxy_url,
            domain=box.e2b.domain,
        )
    kube = box.kubernetes
    assert kube is not None
    return runner_cfg.KubernetesSandboxConfig(
        namespace=namespace,
        image=kube.image or image,
        runtime_class_name=kube.runtime_class_name,
        run_as_user=kube.run_as_user,
        resources=runner_cfg.Resources(
            requests={k: str(v) for k, v in kube.resources.requests.items()},
            limits={k: str(v) for k, v in kube.resources.limits.items()},
        ),
        node_selector=dict(pool.pod.node_selector),
        labels=sandbox_labels(run, name),
        proxy_pod_labels=proxy_pod_labels(run),
        proxy_port=placement.proxy_port,
        proxy_end_port=max(worker_ports(placement.proxy_port, proxy_workers), default=None),
    )


def _runner_tasks(spec: TrainingRunSpec, placement: Placement) -> runner_cfg.DirTasks | runner_cfg.HubTasks:
    tasks = spec.tasks
    if tasks.hub is not None:
        token = placement.path("tasks-token") if tasks.hub.token_secret else None
        return runner_cfg.HubTasks(repo_id=tasks.hub.repo, revision=tasks.hub.revision, token_file=token)
    # A PVC is mounted and an image's task directory copied (by an init container) at the tasks path.
    return runner_cfg.DirTasks(path=placement.path("tasks"))


def _merge_pod(run: PodOverrides, pool: PodOverrides) -> PodOverrides:
    """Runner Pods get the run's scheduling settings, with the pool's own winning where both say something."""
    merged = run.model_dump(by_alias=False) | {k: v for k, v in pool.model_dump(by_alias=False).items() if v}
    merged["node_selector"] = run.node_selector | pool.node_selector
    merged["labels"] = run.labels | pool.labels
    merged["annotations"] = run.annotations | pool.annotations
    return PodOverrides.model_validate(merged)
