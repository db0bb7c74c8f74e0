"""The engine: a run's own vLLM servers or an EnginePool's, the adapter store beside them, and where a run's
learner and proxy reach them (EngineTarget)."""

from __future__ import annotations

from typing import Any

from harnessrl.operator.api.common import PodOverrides
from harnessrl.operator.api.enginepool import EnginePoolSpec
from harnessrl.operator.api.trainingrun import EngineServers, ServedModel, TrainingRunSpec
from harnessrl.operator.plan.memory import check_context, known_shape
from harnessrl.operator.plan.names import child_name, engine_pool_store_secret, run_store_secret
from harnessrl.operator.plan.placement import ADAPTER_STORE_PORT, ClusterPlacement, Placement
from harnessrl.operator.plan.secret_files import engine_pool_api_key, hub_token_env, secret_file
from harnessrl.operator.plan.types import (
    AdapterStorePlan,
    Component,
    ComponentKind,
    EnginePoolPlan,
    EnginePoolUnavailable,
    EngineTarget,
    Images,
    PlanError,
    Port,
    SecretFile,
)
from harnessrl.runtime.contracts.engine_config import API_KEY_ENV, EngineConfig, LoraSettings

# vLLM accepts only these LoRA ranks for --max-lora-rank; the engine serves the smallest one that fits.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


# Full-weight sync over vLLM's weight-transfer API (runtime/learner/sync.py): what the engines need for it.
NCCL_ENGINE_ARGS = ["--weight-transfer-config", '{"backend":"nccl"}']


NCCL_ENGINE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}


def engine_component(run: str, spec: TrainingRunSpec, placement: Placement) -> Component | None:
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
        LoraSettings(enabled=engine.weight_sync == "lora", max_rank=lora_rank(lora.rank if lora else 16)),
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
    token = secret_file(hub.token_secret, placement.path("base-model-token")) if hub and hub.token_secret else None
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
    lora = LoraSettings(enabled=True, max_rank=lora_rank(spec.lora.max_rank), max_loras=spec.lora.max_loras)
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


def adapter_store_plan(
    run: str, spec: TrainingRunSpec, placement: Placement, images: Images, admin_secret: str
) -> AdapterStorePlan | None:
    if spec.engine.pool is not None or spec.engine.weight_sync != "lora" or placement.adapter_store_url(run, 0) is None:
        return None
    token = SecretFile(secret=admin_secret, key="token", path=placement.path("proxy-admin-token"))
    return AdapterStorePlan(image=images.image("proxy"), port=ADAPTER_STORE_PORT, token=token)


def engine_target(
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


def lora_rank(rank: int) -> Any:
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise PlanError(f"model.adapter.lora.rank {rank} is above vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}")
    return fitting[0]
