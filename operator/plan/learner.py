"""The learner: its LearnerConfig (GRPO, sync, checkpoints, export, tracking, evaluation rounds), GPUs and nodes."""

from __future__ import annotations

import yaml
from harnessrl.operator.api.common import SecretKeyRef
from harnessrl.operator.api.harnesspool import HarnessPoolSpec
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.plan.memory import check_learner_memory, gradient_checkpointing
from harnessrl.operator.plan.names import child_name
from harnessrl.operator.plan.placement import Placement, eval_task_ids_file, validation_task_ids_file
from harnessrl.operator.plan.pools import eval_pool_names, harness_name
from harnessrl.operator.plan.proxy import engine_client_pod
from harnessrl.operator.plan.secret_files import hub_read_tokens, runner_token_file, secret_file
from harnessrl.operator.plan.types import (
    Component,
    ComponentKind,
    EngineTarget,
    Images,
    PlanError,
    Port,
    SecretFile,
)
from harnessrl.runtime.contracts import learner_config as learner_cfg
from harnessrl.runtime.contracts.coordinator import PoolHarness
from harnessrl.runtime.contracts.learner_config import LearnerConfig
from harnessrl.runtime.contracts.proxy_config import worker_ports

NCCL_PORT = 29551


def learner_component(
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
        secrets.append(secret_file(spec.export.token_secret, placement.path("hub-token")))
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
        pod=engine_client_pod(spec),
    )


def _tracking(spec: TrainingRunSpec, placement: Placement) -> tuple[learner_cfg.TrackingConfig, list[SecretFile]]:
    """The learner's trackers, and the Secrets it reads their credentials from (as files)."""
    t = spec.tracking
    secrets: list[SecretFile] = []

    def file(ref: SecretKeyRef, what: str) -> str:
        secrets.append(secret_file(ref, placement.path(what)))
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
                                        wandb=wandb, mlflow=mlflow, trackio=trackio, viewer_url=t.viewer_url)
    return config, secrets


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
