"""TrainingRun + HarnessPools -> Plan: names, replicas, images and each component's rendered config."""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

import pytest
import yaml
from harnessrl.operator.api.harnesspool import HarnessPoolSpec
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.plan import build_plan
from harnessrl.operator.plan.names import child_name
from harnessrl.operator.plan.placement import ClusterPlacement
from harnessrl.operator.plan.types import ComponentKind, Images, PlanError
from harnessrl.runtime.contracts.engine_config import EngineConfig
from harnessrl.runtime.contracts.harness_versions import pin
from harnessrl.runtime.contracts.learner_config import LearnerConfig, SyncMode, TrackingConfig
from harnessrl.runtime.contracts.proxy_config import ProxyConfig
from harnessrl.runtime.contracts.runner_config import (
    CustomHarnessSpec,
    DirTasks,
    E2BSandboxConfig,
    HubTasks,
    KubernetesSandboxConfig,
    LocalSandboxConfig,
    RunnerConfig,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "trainingrun.yaml").read_text())
POOLS = {
    p.stem: HarnessPoolSpec.model_validate(yaml.safe_load(p.read_text())["spec"])
    for p in (ROOT / "examples" / "harnesspools").glob("*.yaml")
}


def example_plan(**changes: Any) -> Any:
    spec = TrainingRunSpec.model_validate(EXAMPLE["spec"] | changes)
    return build_plan("run", "team", spec, POOLS, ClusterPlacement("team"), Images(registry="reg.io/h", tag="1.2"))


def test_children_have_deterministic_names_and_one_runner_set_per_pool() -> None:
    plan = example_plan()
    assert [c.name for c in plan.components()] == [
        "run-engine", "run-proxy", "run-learner", "run-claude-code-runner", "run-codex-runner", "run-mini-swe-agent-runner",
        "run-gemini-cli-runner",  # evaluated under (spec.eval.harnesses), not trained on
    ]
    assert child_name("r", ComponentKind.RUNNER, "p") == "r-p-runner"
    assert plan == example_plan()  # pure: same input, same plan


def test_component_configs_are_the_components_own_models_wired_together() -> None:
    plan = example_plan()
    engine, proxy, learner = plan.engine.config, plan.proxy.config, plan.learner.config
    assert isinstance(engine, EngineConfig) and isinstance(proxy, ProxyConfig) and isinstance(learner, LearnerConfig)
    engines = ["http://run-engine-0.run-engine.team.svc:8000", "http://run-engine-1.run-engine.team.svc:8000"]
    assert learner.engine.urls == engines and learner.engine.sync == SyncMode.lora
    assert [str(u).rstrip("/") for u in proxy.upstream_urls] == engines
    assert learner.proxy.url == "http://run-proxy.team.svc:8080"
    # LoRA rank 32 is served with the same max rank; the engine hot-loads it.
    assert engine.lora.enabled and engine.lora.max_rank == 32 and engine.tensor_parallel_size == 1
    assert engine.model == "Qwen/Qwen3-8B" and engine.max_model_len == 40960 and engine.device == "cuda"
    assert learner.grpo.steps == 400 and learner.grpo.groups_per_step == 8
    # grpo.maxTokensPerStep is the update's token budget, not the size of a forward pass (defect 4).
    assert learner.grpo.max_tokens_per_step == 2_000_000 and learner.grpo.micro_batch_tokens == 16384
    assert (learner.grpo.loss_type, learner.grpo.scale_rewards, learner.grpo.vllm_importance_sampling_mode) == (
        "dapo", "batch", "token_truncate")
    assert learner.grpo.dr_grpo_tokens == 40960 and learner.model.gradient_checkpointing
    assert learner.grpo.max_grad_norm == 1.0  # the API's default; 0 turns clipping off
    unclipped = example_plan(grpo=EXAMPLE["spec"]["grpo"] | {"maxGradNorm": 0}).learner.config
    assert isinstance(unclipped, LearnerConfig) and unclipped.grpo.max_grad_norm is None
    # grpo.temperature: the proxy samples training calls at it, the learner scores at it.
    warm = example_plan(grpo=EXAMPLE["spec"]["grpo"] | {"temperature": 0.8, "lossBalance": "harness"})
    assert isinstance(warm.learner.config, LearnerConfig) and isinstance(warm.proxy.config, ProxyConfig)
    assert (warm.learner.config.grpo.temperature, warm.proxy.config.temperature) == (0.8, 0.8)
    assert (learner.grpo.loss_balance, warm.learner.config.grpo.loss_balance) == ("token", "harness")
    # grpo.seededSampling: the proxy seeds every call from grpo.seed; unseeded by default.
    seeded = example_plan(grpo=EXAMPLE["spec"]["grpo"] | {"seed": 11, "seededSampling": True}).proxy.config
    assert isinstance(seeded, ProxyConfig) and (seeded.sampling_seed, proxy.sampling_seed) == (11, None)
    assert [(h.pool, h.harness, h.weight) for h in learner.harnesses] == [
        ("claude-code", "claude-code", 2), ("codex", "codex", 1), ("mini-swe-agent", "mini-swe-agent", 1),
    ]
    # Export every 100 steps with a checkpoint every 50 steps = every 2nd checkpoint; the token is a file.
    assert learner.export is not None and learner.export.every == 2 and learner.export.token_env is None
    assert str(learner.export.token_file) == "/var/run/secrets/harnessrl/hub/token"
    # The model card shows the run's spec: the spec itself, its Secrets by reference.
    assert TrainingRunSpec.model_validate(yaml.safe_load(learner.export.run_spec)) == TrainingRunSpec.model_validate(
        EXAMPLE["spec"])
    assert proxy.call_budget_default == 200 and proxy.admission.max_sessions == 512


def test_runner_configs_follow_their_pools() -> None:
    plan = example_plan()
    runners = {r.pool: r for r in plan.runners}
    claude = runners["claude-code"].config
    assert isinstance(claude, RunnerConfig)
    assert isinstance(claude.sandbox, KubernetesSandboxConfig)
    assert claude.sandbox.runtime_class_name == "gvisor" and claude.sandbox.namespace == "team"
    assert claude.sandbox.proxy_pod_labels == {"harnessrl.io/run": "run", "harnessrl.io/component": "proxy"}
    assert claude.concurrency == 32 and claude.step_budget == 50 and claude.model == "policy"
    assert isinstance(claude.tasks, HubTasks) and claude.tasks.repo_id == "harnessrl/swe-smith-harbor"
    assert runners["claude-code"].image == "reg.io/h/harness-claude-code:1.2"
    assert runners["claude-code"].replicas == 2
    mini = runners["mini-swe-agent"].config
    assert isinstance(mini, RunnerConfig) and isinstance(mini.sandbox, LocalSandboxConfig)
    assert mini.sandbox.memory_mb == 8192
    # Isolated by default: the pool must opt out, and the runner refuses to start unisolated otherwise.
    assert mini.sandbox.network == "proxy" and mini.sandbox.allow_unisolated is False
    # The run's scheduling settings reach runner Pods too.
    assert runners["codex"].pod.priority_class_name == "training"


def test_a_pool_that_allows_an_unisolated_local_sandbox_says_so_to_its_runner() -> None:
    local = POOLS["mini-swe-agent"].model_dump(by_alias=True)
    local["sandbox"]["local"] |= {"allowUnisolated": True, "network": "host"}
    pools = {**POOLS, "mini-swe-agent": HarnessPoolSpec.model_validate(local)}
    spec = TrainingRunSpec.model_validate(EXAMPLE["spec"])
    plan = build_plan("run", "team", spec, pools, ClusterPlacement("team"), Images(registry="reg.io/h", tag="1.2"))
    sandbox = {r.pool: r for r in plan.runners}["mini-swe-agent"].config.sandbox
    assert isinstance(sandbox, LocalSandboxConfig) and sandbox.allow_unisolated and sandbox.network == "host"


def test_custom_and_e2b_pools() -> None:
    plan = example_plan(harnesses=[{"pool": "custom"}, {"pool": "gemini-cli"}])
    runners = {r.pool: r for r in plan.runners}
    custom = runners["custom"].config
    assert isinstance(custom, RunnerConfig) and isinstance(custom.harness, CustomHarnessSpec)
    assert custom.harness.dialect == "openai_responses" and runners["custom"].image == "reg.io/h/harness-runner:1.2"
    assert isinstance(custom.sandbox, KubernetesSandboxConfig) and custom.sandbox.image == "ghcr.io/example/my-agent:1.4.0"
    gemini = runners["gemini-cli"].config
    assert isinstance(gemini, RunnerConfig) and isinstance(gemini.sandbox, E2BSandboxConfig)
    assert [s.path for s in runners["gemini-cli"].secrets] == [
        "/var/run/secrets/harnessrl/runner/token", "/var/run/secrets/harnessrl/e2b/api-key",
    ]


def test_suspend_scales_every_workload_to_zero_and_suspends_the_learner() -> None:
    from harnessrl.operator.kube import Owner, render

    plan = example_plan(suspend=True)
    assert plan.suspended
    assert [c.replicas for c in plan.components()] == [c.replicas for c in example_plan().components()]  # as it runs
    rendered = render(plan, Owner(name="run", uid="u"))
    assert {m["metadata"]["name"]: m["spec"]["replicas"] for m in rendered if m["kind"] in ("StatefulSet", "Deployment")}
    assert all(m["spec"]["replicas"] == 0 for m in rendered if m["kind"] in ("StatefulSet", "Deployment"))
    assert [m["spec"]["suspend"] for m in rendered if m["kind"] == "Job"] == [True]


def test_pvc_sources_and_cpu_engine() -> None:
    plan = example_plan(
        model={"base": {"pvc": {"claimName": "weights", "path": "qwen"}}, "adapter": {"full": {}}},
        tasks={"pvc": {"claimName": "tasks"}},
        engine={"gpus": 0, "weightSync": "nccl", "replicas": 1},
    )
    engine = plan.engine.config
    assert isinstance(engine, EngineConfig)
    assert engine.model == "/var/lib/harnessrl/model" and engine.device == "cpu" and not engine.lora.enabled
    runner = plan.runners[0].config
    assert isinstance(runner, RunnerConfig) and isinstance(runner.tasks, DirTasks)


def test_missing_pool_and_unsupported_combinations_are_plan_errors() -> None:
    spec = TrainingRunSpec.model_validate(EXAMPLE["spec"])
    with pytest.raises(PlanError, match="HarnessPool codex not found in namespace team"):
        build_plan("run", "team", spec, {k: v for k, v in POOLS.items() if k != "codex"}, ClusterPlacement("team"))
    pinned = pin("claude-code").version
    old = POOLS["claude-code"].model_copy(
        update={"harness": POOLS["claude-code"].harness.model_copy(
            update={"known": POOLS["claude-code"].harness.known.model_copy(update={"version": "0.0.1"})}  # type: ignore[union-attr]
        )}
    )
    with pytest.raises(PlanError, match=f"not the pinned {pinned}"):
        build_plan("run", "team", spec, POOLS | {"claude-code": old}, ClusterPlacement("team"))
    with pytest.raises(PlanError, match="largest LoRA rank"):
        example_plan(model={"base": {"hub": {"repo": "a/b"}}, "adapter": {"lora": {"rank": 1024}}})
    # Nothing in a cluster would restart the engines on each published policy (`harnessrl run` does).
    with pytest.raises(PlanError, match="weightSync restart runs only in `harnessrl run`"):
        example_plan(engine={"weightSync": "restart"})


def test_nccl_weight_sync_wires_engine_and_learner() -> None:
    # NCCL sync needs an unsharded learner (test_operator_learner_scale.py), so a model whose full fine-tune
    # fits one GPU (an 8B one needs its fp32 states sharded: test_learner_memory.py).
    one = EXAMPLE["spec"]["learner"] | {"gpus": 1}
    plan = example_plan(
        model={"base": {"hub": {"repo": "Qwen/Qwen3-1.7B"}}, "adapter": {"full": {}}},
        engine={"replicas": 1, "gpus": 2, "weightSync": "nccl"}, learner=one,
    )
    engine, learner = plan.engine.config, plan.learner.config
    assert isinstance(engine, EngineConfig) and isinstance(learner, LearnerConfig)
    assert engine.env["VLLM_SERVER_DEV_MODE"] == "1" and '{"backend":"nccl"}' in engine.extra_args
    assert engine.tensor_parallel_size == 2 and not engine.lora.enabled
    assert learner.engine.sync == SyncMode.nccl and learner.engine.nccl_master_address_env == "POD_IP"
    assert [p.name for p in plan.learner.ports] == ["http", "nccl-0"]
    # N engine replicas: one transfer group each, on its own port (the learner's master port + i).
    three = example_plan(model={"base": {"hub": {"repo": "a/b"}}, "adapter": {"full": {}}},
                         engine={"replicas": 3, "weightSync": "nccl"}, learner=one)
    assert isinstance(three.learner.config, LearnerConfig) and len(three.learner.config.engine.urls) == 3
    assert [(p.name, p.port) for p in three.learner.ports][1:] == [("nccl-0", 29551), ("nccl-1", 29552), ("nccl-2", 29553)]


def test_eval_schedule_reaches_the_learner_and_eval_only_pools_get_runners() -> None:
    plan = example_plan(eval={"everySteps": 25, "split": "test", "harnesses": ["codex", "gemini-cli"], "limit": 40,
                              "attempts": 2})
    learner = plan.learner.config
    assert isinstance(learner, LearnerConfig) and learner.eval is not None
    # Trained on: the run's harnesses only; evaluated under: spec.eval.harnesses, with each pool's harness.
    assert [h.pool for h in learner.harnesses] == ["claude-code", "codex", "mini-swe-agent"]
    assert [(p.pool, p.harness) for p in learner.eval.pools] == [("codex", "codex"), ("gemini-cli", "gemini-cli")]
    assert (learner.eval.every_steps, learner.eval.limit, learner.eval.attempts) == (25, 40, 2)
    assert learner.eval.tasks.split == "test"
    assert str(learner.eval.tasks.file) == "/var/lib/harnessrl/task-ids/eval-ids.txt"
    runners = {c.pool: c for c in plan.runners}
    assert list(runners) == ["claude-code", "codex", "mini-swe-agent", "gemini-cli"]
    gemini = runners["gemini-cli"].config
    assert isinstance(gemini, RunnerConfig) and gemini.pool == "gemini-cli"
    # It leases from the learner's coordinator like any runner.
    assert str(gemini.coordinator_url).rstrip("/") == "http://run-learner.team.svc:8090"
    assert runners["gemini-cli"].replicas == POOLS["gemini-cli"].replicas


def test_eval_defaults_to_the_trained_pools_and_is_absent_without_spec_eval() -> None:
    plan = example_plan(eval={"everySteps": 5})
    learner = plan.learner.config
    assert isinstance(learner, LearnerConfig) and learner.eval is not None
    assert [p.pool for p in learner.eval.pools] == ["claude-code", "codex", "mini-swe-agent"]
    assert [c.pool for c in plan.runners] == ["claude-code", "codex", "mini-swe-agent"]
    no_eval = {k: v for k, v in EXAMPLE["spec"].items() if k != "eval"}
    plan = build_plan("run", "team", TrainingRunSpec.model_validate(no_eval), POOLS, ClusterPlacement("team"))
    assert plan.learner.config.eval is None
    assert [c.pool for c in plan.runners] == ["claude-code", "codex", "mini-swe-agent"]


def test_a_missing_eval_pool_is_a_plan_error() -> None:
    pools = {k: v for k, v in POOLS.items() if k != "gemini-cli"}
    with pytest.raises(PlanError, match="HarnessPool gemini-cli not found in namespace team"):
        build_plan("run", "team", TrainingRunSpec.model_validate(EXAMPLE["spec"]), pools, ClusterPlacement("team"))


def test_tracking_reaches_the_learner_with_each_credential_a_secret_file() -> None:
    default = example_plan().learner.config
    assert isinstance(default, LearnerConfig) and default.tracking == TrackingConfig()  # TensorBoard files only
    none = example_plan(tracking={"reportTo": ["none"]}).learner.config
    assert isinstance(none, LearnerConfig) and none.tracking.report_to == []
    plan = example_plan(tracking={
        "reportTo": ["tensorboard", "wandb", "mlflow", "trackio"], "project": "agents",
        "wandb": {"apiKeySecret": {"name": "wandb", "key": "api-key"}, "entity": "team"},
        "mlflow": {"trackingUriSecret": {"name": "mlflow", "key": "uri"}, "tokenSecret": {"name": "mlflow"}},
        "trackio": {"spaceId": "org/board", "tokenSecret": {"name": "hf-token"}},  # the export's Secret too
    })
    learner = plan.learner.config
    assert isinstance(learner, LearnerConfig)
    t = learner.tracking
    assert t.report_to == ["tensorboard", "wandb", "mlflow", "trackio"] and t.project == "agents"
    assert t.wandb is not None and t.mlflow is not None and t.trackio is not None
    assert (t.wandb.entity, t.trackio.space_id) == ("team", "org/board")
    files = {(s.secret, s.key): s.path for s in plan.learner.secrets}
    assert files[("wandb", "api-key")] == str(t.wandb.api_key_file) == "/var/run/secrets/harnessrl/wandb/api-key"
    assert files[("mlflow", "uri")] == str(t.mlflow.tracking_uri_file)
    assert files[("mlflow", "token")] == str(t.mlflow.token_file)
    assert learner.export is not None  # the export's Secret too: mounted once for each reader
    hf = [s.path for s in plan.learner.secrets if s.secret == "hf-token"]
    assert hf == [str(learner.export.token_file), str(t.trackio.token_file)]
    # Each Secret file is mounted as its own directory: no two share one.
    dirs = [posixpath.dirname(s.path) for s in plan.learner.secrets]
    assert len(set(dirs)) == len(dirs)


def test_a_pools_replicas_are_split_among_the_runs_using_it() -> None:
    from harnessrl.operator.plan.pools import pool_share

    assert [pool_share(5, {"a", "b"}, r) for r in ("a", "b")] == [3, 2]
    assert [pool_share(5, {"a", "b", "c"}, r) for r in ("a", "b", "c")] == [2, 2, 1]
    assert pool_share(4, set(), "a") == 4  # the only run (not yet indexed) gets the whole pool
    assert [pool_share(1, {"a", "b"}, r) for r in ("a", "b")] == [1, 1]  # fewer runners than runs: none starves
    assert pool_share(0, {"a", "b"}, "a") == 0  # a pool scaled to zero
    assert sum(pool_share(7, {"x", "y", "z"}, r) for r in ("x", "y", "z")) == 7
