"""The runners: one component per HarnessPool, its RunnerConfig, sandbox and task source."""

from __future__ import annotations

from harnessrl.operator.api.common import PodOverrides
from harnessrl.operator.api.harnesspool import HarnessPoolSpec
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.plan.names import child_name, proxy_pod_labels, sandbox_labels, sandbox_name_prefix
from harnessrl.operator.plan.placement import Placement
from harnessrl.operator.plan.pools import harness_name
from harnessrl.operator.plan.secret_files import hub_read_tokens, runner_token_file, secret_file
from harnessrl.operator.plan.types import Component, ComponentKind, Images, PlanError, Port, SecretFile
from harnessrl.runtime.contracts import runner_config as runner_cfg
from harnessrl.runtime.contracts.harness_versions import pin
from harnessrl.runtime.contracts.proxy_config import worker_ports
from harnessrl.runtime.contracts.runner_config import RunnerConfig

# The API spells dialects as in its docs (kebab-case), the runner as Python identifiers.
RUNNER_DIALECT: dict[str, runner_cfg.Dialect] = {
    "openai-chat": "openai_chat",
    "openai-responses": "openai_responses",
    "anthropic": "anthropic",
    "gemini": "gemini",
}


def runner_component(
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
        secrets.append(secret_file(box.e2b.api_key_secret, placement.path("e2b-api-key")))
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
        name_prefix=sandbox_name_prefix(run, name),
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
