"""The capture proxy: its ProxyConfig and replicas."""

from __future__ import annotations

from harnessrl.operator.api.common import ENGINE_POOL_LABEL, PodOverrides
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.plan.names import child_name
from harnessrl.operator.plan.placement import Placement
from harnessrl.operator.plan.secret_files import runner_token_file
from harnessrl.operator.plan.types import Component, ComponentKind, EngineTarget, Images, Port, SecretFile
from harnessrl.runtime.contracts.proxy_config import AdmissionLimits, ProxyConfig, worker_ports


def proxy_component(
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
        pod=engine_client_pod(spec),
    )


def engine_client_pod(spec: TrainingRunSpec) -> PodOverrides:
    """The run's pod overrides; on an EnginePool, with the label its NetworkPolicy admits (proxy and learner)."""
    if spec.engine.pool is None:
        return spec.pod
    return spec.pod.model_copy(update={"labels": {**spec.pod.labels, ENGINE_POOL_LABEL: spec.engine.pool}})
