"""LearnerConfig: everything `harnessrl learner --config FILE` needs (YAML or JSON, rendered by the operator).

The learner process hosts the coordinator (leases, groups, staleness), the GRPO step, weight sync to the
engines, checkpoints, Hub export and experiment tracking. Secrets (proxy admin token, Hub token, trackers'
credentials) are named here by file or env var, never inlined, so the config can be logged and stored in status.
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

import yaml
from harnessrl.runtime.contracts.coordinator import PoolHarness
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Balance = Literal["token", "rollout", "harness"]
# How each token's importance weight π_proximal/π_engine is bounded (TRL's vllm_importance_sampling_mode): per
# token or one ratio per sequence, truncated into [clip_min, clip_max] or masked (zero) outside it.
IsMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


class _Cfg(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Cfg):
    path: Path = Field(description="local directory of the base weights (HF format); the operator downloads hub ids")
    # Name the engines serve the base model under (vLLM --served-model-name); LoRA adapters get `<name>-v<N>`.
    served_name: str = Field(min_length=1, max_length=256)
    # Runs sharing one engine pool publish under distinct prefixes, so no run loads, replaces or unloads another's.
    adapter_prefix: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")

    @property
    def adapter_name_prefix(self) -> str:
        """What this run's LoRA adapters are named after: `<prefix>-v<N>`."""
        return self.adapter_prefix or self.served_name
    # Precision of forward and backward: auto = bf16 on GPU, fp32 on CPU. Weights and optimizer state are fp32.
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    gradient_checkpointing: bool = False


class AdapterConfig(_Cfg):
    kind: Literal["lora", "full"] = "lora"
    rank: int = Field(16, ge=1, le=1024)
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
        max_length=64,
    )


class GrpoConfig(_Cfg):
    group_size: int = Field(8, ge=2, le=1024)
    # Last resort only: a rollout whose oldest sampled token is more than this many versions old is dropped (and
    # counted). Below it a stale rollout is kept and corrected token by token (vllm_importance_sampling_*):
    # dropping starves slow rollouts, and the slow ones are the hard tasks.
    max_staleness: int = Field(1000, ge=0, le=1000)
    lr: float = Field(1e-5, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    # DAPO-style asymmetric clip of the ratio pi/pi_behaviour: [1 - clip_low, 1 + clip_high].
    clip_low: float = Field(0.2, ge=0, le=1)
    clip_high: float = Field(0.28, ge=0)
    # How token losses are averaged (TRL's loss_type): "dapo" = over all loss tokens of the update; "grpo" = per
    # sequence, then over sequences; "dr_grpo" = summed per sequence, divided by sequences × dr_grpo_tokens
    # (a constant, so no length bias).
    # "cispo" (TRL's): -min(ratio, clip_high).detach() × A × log π per token, averaged as dapo; clip_high is then
    # the weight's cap ε_max (ScaleRL recommends 5), not an epsilon around 1.
    loss_type: Literal["dapo", "grpo", "dr_grpo", "cispo"] = "dapo"
    dr_grpo_tokens: int = Field(32768, ge=1, description="dr_grpo's constant: the longest sequence trained")
    # What share of an update's loss each rollout carries (balance.py): as the loss type gives it ("token"), one
    # equal share per rollout ("rollout"), or per harness and then per rollout ("harness").
    loss_balance: Balance = "token"
    # Advantages (TRL's scale_rewards): r - group mean, divided by the group's std ("group"), by the std of all
    # the step's rewards ("batch"), or not at all ("none", Dr. GRPO). See reward.scale_batch.
    scale_rewards: Literal["group", "batch", "none"] = "batch"
    # The ratio the clip acts on (TRL's importance_sampling_level): per token, or GSPO's one per sequence (the
    # geometric mean of its tokens' ratios).
    importance_sampling_level: Literal["token", "sequence"] = "token"
    # Baseline of the advantage: the group's mean, or RLOO's mean of the other rollouts of the group
    # (r − mean × G/(G−1)); either is then scaled as `scale_rewards` says.
    baseline: Literal["mean", "rloo"] = "mean"
    # Off-policy correction (TRL's vllm_importance_sampling_*): the trainer's own logprobs before the step are
    # the proximal policy the clip is taken against, and each token's loss is weighted by π_proximal/π_engine,
    # the engine logprob recorded with the token being its own behaviour policy, however many versions old;
    # bounded by `vllm_importance_sampling_mode` into [clip_min, clip_max]. Off: the clip is taken against the
    # engine's logprobs directly and a stale token's ratio is unbounded on the side the clip does not cut.
    # Token level by default (TRL: sequence_mask): a sequence ratio multiplies thousands of token ratios, so a
    # stale agent rollout would nearly always fall outside the band and be masked whole, i.e. dropped.
    # KL penalty to the base policy (TRL's beta): beta × k3(π_base/π) per token is added to the loss, times the
    # ratio with use_bias_correction_kl (TRL's default). The base is a LoRA's adapter switched off (one more
    # forward per micro-batch); a full fine-tune would need a second copy of the weights, which it does not get.
    beta: float = Field(0.0, ge=0)
    use_bias_correction_kl: bool = True
    vllm_importance_sampling_correction: bool = True
    vllm_importance_sampling_mode: IsMode = "token_truncate"
    vllm_importance_sampling_clip_min: float | None = Field(None, ge=0)
    vllm_importance_sampling_clip_max: float | None = Field(3.0, gt=0)
    steps: int = Field(100, ge=1)
    groups_per_step: int = Field(4, ge=1, le=4096)
    # Open groups the coordinator keeps ahead of training (leasable at once); default 2 x groups_per_step.
    max_open_groups: int | None = Field(None, ge=1)
    # Dynamic sampling's bound: groups without reward variance are skipped and others awaited, but once a step
    # has consumed this many groups it trains on the trainable ones it has (none: the step makes no update).
    # Without it, a policy that solves nearly everything makes each step wait for ever rarer mixed groups, and
    # one that solves everything never steps again. Default 3 x groups_per_step.
    max_groups_per_step: int | None = Field(None, ge=1)
    micro_batch_tokens: int = Field(16384, ge=16, description="token budget of one forward/backward pass")
    # Concatenate a micro-batch's sequences into one row (positions restart per sequence) instead of padding
    # rows to the longest: no padding token is computed (packing.pack_flat).
    padding_free: bool = True
    # Optimizer updates per step: the step's sequences are split into this many mini-batches, each one
    # update; within a mini-batch, gradients accumulate over its packed micro-batches.
    mini_batches: int = Field(1, ge=1, le=64)
    # Most tokens one update trains on: a mini-batch with more is split (in order) into further updates.
    max_tokens_per_step: int | None = Field(None, ge=16)
    adv_epsilon: float = Field(1e-4, gt=0)
    # Training sessions sample at this temperature (the proxy enforces it); the learner divides its logits by it,
    # so its logprobs are of the distribution the engine sampled from.
    temperature: float = Field(1.0, gt=0.0, le=2.0)
    seed: int = 0

    @model_validator(mode="after")
    def _open_groups(self) -> GrpoConfig:
        if self.max_open_groups is not None and self.max_open_groups < self.groups_per_step:
            raise ValueError("grpo.max_open_groups must be >= grpo.groups_per_step")
        if self.max_groups_per_step is not None and self.max_groups_per_step < self.groups_per_step:
            raise ValueError("grpo.max_groups_per_step must be >= grpo.groups_per_step")
        if self.loss_type == "cispo" and self.clip_high < 1:
            raise ValueError("grpo.clip_high is CISPO's weight cap ε_max: below 1 it scales down every on-policy token")
        lo, hi = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if self.vllm_importance_sampling_correction and lo is None and hi is None:
            raise ValueError("grpo.vllm_importance_sampling_correction needs clip_min or clip_max: a ratio must be bounded")
        if lo is not None and hi is not None and lo > hi:
            raise ValueError("grpo.vllm_importance_sampling_clip_min must be <= vllm_importance_sampling_clip_max")
        return self

    def open_groups(self) -> int:
        return self.max_open_groups if self.max_open_groups is not None else 2 * self.groups_per_step

    def groups_per_step_limit(self) -> int:
        return self.max_groups_per_step if self.max_groups_per_step is not None else 3 * self.groups_per_step


class RewardConfig(_Cfg):
    """reward = correctness × (1 + bonus × scale / (scale + tool_calls)), bonus only when correct, minus
    tool_mismatch_penalty per tool call the harness could not run (at most 1)."""

    bonus: float = Field(0.1, ge=0)
    scale: float = Field(15.0, gt=0)
    tool_mismatch_penalty: float = Field(0.0, ge=0, le=1)


class HarnessWeight(_Cfg):
    pool: str = Field(min_length=1, max_length=253)
    harness: str = Field(min_length=1, max_length=63)
    weight: int = Field(1, ge=1, le=1000)


class TaskSource(_Cfg):
    """Task ids to train on: listed inline, or one per line in a file (a split of the task set)."""

    ids: list[str] = Field(default_factory=list)
    file: Path | None = None
    split: str = "train"
    # Task order is shuffled with grpo.seed; each task is drawn once per epoch.
    shuffle: bool = True

    @model_validator(mode="after")
    def _one_source(self) -> TaskSource:
        if bool(self.ids) == (self.file is not None):
            raise ValueError("tasks: give exactly one of `ids` or `file`")
        return self

    def load(self) -> list[str]:
        if self.file is None:
            ids = list(self.ids)
        else:
            ids = [ln.strip() for ln in self.file.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        if not ids:
            raise ValueError(f"tasks: no task ids in {self.file or 'ids'}")
        if len(set(ids)) != len(ids):
            raise ValueError("tasks: duplicate task ids")
        return ids


_P = TypeVar("_P", HarnessWeight, PoolHarness)


def once_per_pool(items: list[_P], what: str) -> list[_P]:
    if len({i.pool for i in items}) != len(items):
        raise ValueError(f"{what}: each pool may appear once")
    return items


class EvalSchedule(_Cfg):
    """pass@1 of the policy on held-out tasks under each eval pool, every `every_steps` steps and after the
    last step, leased to the pools' runners like training rollouts (see evaluation.py)."""

    every_steps: int = Field(50, ge=1)
    at_start: bool = Field(True, description="evaluate the base policy before the first step (a round at step 0)")
    pools: list[PoolHarness] = Field(min_length=1, max_length=64)
    tasks: TaskSource = Field(description="the eval split's task ids (their order is not used: sorted, then limited)")
    # Evaluated in the same rounds; picks the best checkpoint and feeds the collapse alarm (evaluation.py).
    validation: TaskSource | None = Field(None, description="the validation split's task ids (sorted, then limited)")
    limit: int | None = Field(None, ge=1, description="evaluate at most this many tasks (the first, sorted)")
    attempts: int = Field(1, ge=1, le=64, description="samples per task and pool")
    max_unscored: int = Field(3, ge=1, le=100, description="infra/grader failures of a rollout before it is left out")

    @field_validator("pools")
    @classmethod
    def _distinct_pools(cls, pools: list[PoolHarness]) -> list[PoolHarness]:
        return once_per_pool(pools, "eval.pools")

    def task_ids(self) -> list[str]:
        return self._limited(self.tasks)

    def validation_task_ids(self) -> list[str]:
        return self._limited(self.validation) if self.validation is not None else []

    def _limited(self, source: TaskSource) -> list[str]:
        ids = sorted(source.load())
        return ids[: self.limit] if self.limit is not None else ids


class ProxyLink(_Cfg):
    url: str = Field(min_length=1, description="proxy base URL (any replica: sessions, sequences)")
    # Each replica serves its own sessions with the policy it was last given, and a Service reaches one replica
    # per request: a policy set through it would leave the others sampling from an older one.
    replica_urls: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="every proxy replica's own base URL; PUT /policy goes to each (empty: to `url`, one replica)",
    )
    admin_token_file: Path
    # A replica of several workers hands each session to one of them: its base URL is the replica's host at the
    # worker's port. Sequences are fetched only from these URLs and the replicas' own.
    worker_ports: list[int] = Field(default_factory=list, max_length=64,
                                    description="each replica's worker ports (empty: one process per replica)")

    def session_urls(self) -> set[str]:
        """Every base URL a session of this run's proxy can have (no trailing slash)."""
        replicas = [u.rstrip("/") for u in [self.url, *self.replica_urls]]
        workers = {urlunsplit(parts._replace(netloc=f"{parts.hostname}:{port}"))
                   for parts in map(urlsplit, replicas) for port in self.worker_ports}
        return set(replicas) | workers

    def read_admin_token(self) -> str:
        token = self.admin_token_file.read_text().strip()
        if not token:
            raise ValueError(f"proxy.admin_token_file {self.admin_token_file} is empty")
        return token


class SyncMode(StrEnum):
    lora = "lora"  # save adapter, POST /v1/load_lora_adapter `<name>-v<N>` on every engine, switch the proxy
    nccl = "nccl"  # full weights over vLLM's weight-transfer API (GPU only): pause -> update -> resume
    restart = "restart"  # write a checkpoint, the engines are restarted on it (by the operator)


class EngineLink(_Cfg):
    urls: list[str] = Field(min_length=1, max_length=256, description="vLLM OpenAI-server base URLs")
    sync: SyncMode = SyncMode.lora
    request_timeout_s: float = Field(120.0, gt=0)
    # nccl only: where this learner's rendezvous listens for the engines' workers (replica i: port + i). vLLM
    # binds rank 0's socket to it, so it must be on this process's own interfaces: in a Pod, the Pod's IP, which
    # the variable `nccl_master_address_env` holds (the downward API's status.podIP), not a Service's ClusterIP.
    nccl_master_address: str = "127.0.0.1"
    nccl_master_address_env: str | None = None
    nccl_master_port: int = Field(29551, ge=1, le=65535 - 256)
    # nccl only: the longest a group's rendezvous or one transfer of the weights may take before it counts as hung.
    sync_timeout_s: float = Field(600.0, gt=0)
    # lora, for engines that do not see the learner's files (a cluster): the adapter store beside each engine
    # (runtime/engine/adapter_store.py), in the order of `urls`; each adapter is uploaded there, then loaded.
    adapter_stores: list[str] = Field(default_factory=list, max_length=256)
    adapter_store_token_file: Path | None = None
    # The engines' API key, where they require one (an EnginePool's: runtime/engine/api_key.py).
    api_key_file: Path | None = None

    @field_validator("urls", "adapter_stores")
    @classmethod
    def _strip(cls, urls: list[str]) -> list[str]:
        return [u.rstrip("/") for u in urls]

    @model_validator(mode="after")
    def _one_store_per_engine(self) -> EngineLink:
        if self.adapter_stores and len(self.adapter_stores) != len(self.urls):
            raise ValueError(f"engine.adapter_stores names {len(self.adapter_stores)} stores for {len(self.urls)} engines")
        if self.adapter_stores and self.adapter_store_token_file is None:
            raise ValueError("engine.adapter_stores needs engine.adapter_store_token_file")
        return self

    def rendezvous_address(self) -> str:
        """The address this learner's NCCL rendezvous listens on: `nccl_master_address_env`'s value if set."""
        if self.nccl_master_address_env is None:
            return self.nccl_master_address
        value = os.environ.get(self.nccl_master_address_env, "").strip()
        if not value:
            raise ValueError(f"engine.nccl_master_address_env names {self.nccl_master_address_env}, which is not set: "
                             "the rendezvous has no address of this Pod's own")
        return value

    def read_store_token(self) -> str:
        assert self.adapter_store_token_file is not None
        return self.adapter_store_token_file.read_text().strip()


class CheckpointConfig(_Cfg):
    dir: Path
    every: int = Field(10, ge=1, description="checkpoint every N steps (and at the end)")
    keep: int = Field(3, ge=1, description="newest checkpoints kept on the volume")


class HubExport(_Cfg):
    repo: str = Field(min_length=3, max_length=200, pattern=r"^[A-Za-z0-9._-]+/[A-Za-z0-9._-]+$")
    # Where the token is: a file (a mounted Secret) or the name of an env var. Never the token itself.
    token_file: Path | None = None
    token_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    every: int = Field(1, ge=1, description="export every N-th checkpoint")
    private: bool = True
    # Each checkpoint goes to its own branch `<revision_prefix><step>`; main holds the best exported one by
    # held-out pass@1 (the newest without evaluations).
    revision_prefix: str = Field("step-", pattern=r"^[A-Za-z0-9._-]*$")
    endpoint: str | None = Field(None, description="Hub URL; None = huggingface_hub's default / HF_ENDPOINT")
    # The TrainingRun's spec as YAML, shown in every model card so a checkpoint says how it was trained. It holds
    # Secrets by reference only (the API has no field for a secret value).
    run_spec: str = ""

    @model_validator(mode="after")
    def _one_token_source(self) -> HubExport:
        if (self.token_file is None) == (self.token_env is None):
            raise ValueError("export: give exactly one of `token_file` or `token_env`")
        return self

    def read_token(self) -> str:
        if self.token_file is not None:
            token = self.token_file.read_text().strip()
            where = f"file {self.token_file}"
        else:
            assert self.token_env is not None
            token = os.environ.get(self.token_env, "").strip()
            where = f"env var {self.token_env}"
        if not token:
            raise ValueError(f"export: Hub token {where} is empty or missing")
        return token


Tracker = Literal["tensorboard", "wandb", "mlflow", "trackio"]


class WandbLink(_Cfg):
    api_key_file: Path
    entity: str | None = None
    base_url: str | None = Field(None, description="a W&B server of one's own; W&B's cloud when None")


class MlflowLink(_Cfg):
    tracking_uri_file: Path = Field(description="a file: the URI may carry credentials")
    token_file: Path | None = None


class TrackioLink(_Cfg):
    space_id: str = Field(min_length=1, max_length=200)
    token_file: Path = Field(description="a Hugging Face token that can write to the Space")


class TrackingConfig(_Cfg):
    """Where each step's metrics and each evaluation's pass@1 go besides metrics.jsonl and eval.jsonl (TRL's
    report_to; see tracking.py). Empty `report_to`: nowhere else."""

    report_to: list[Tracker] = Field(default=["tensorboard"], max_length=4)
    project: str = Field("harnessrl", min_length=1, max_length=128, description="W&B/trackio project, MLflow experiment")
    wandb: WandbLink | None = None
    mlflow: MlflowLink | None = None
    trackio: TrackioLink | None = Field(None, description="a Hugging Face Space; None: files beside the metrics")
    viewer_url: str | None = Field(None, max_length=2048, description="where `harnessrl view` serves this run "
                                   "(TrainingRun spec.tracking.viewerUrl): each step's rollout samples link there; "
                                   "None: the links are the viewer's paths (/rollouts/ID)")

    @model_validator(mode="after")
    def _links(self) -> TrackingConfig:
        for name, link in (("wandb", self.wandb), ("mlflow", self.mlflow)):
            if name in self.report_to and link is None:
                raise ValueError(f"tracking.report_to lists {name}: it needs tracking.{name}")
        return self


class LearnerConfig(_Cfg):
    run_name: str = Field("harnessrl", min_length=1, max_length=253)
    model: ModelConfig
    adapter: AdapterConfig = AdapterConfig()
    grpo: GrpoConfig = GrpoConfig()
    reward: RewardConfig = RewardConfig()
    harnesses: list[HarnessWeight] = Field(min_length=1, max_length=64)
    tasks: TaskSource
    proxy: ProxyLink
    engine: EngineLink
    checkpoint: CheckpointConfig
    export: HubExport | None = None
    eval: EvalSchedule | None = None
    tracking: TrackingConfig = TrackingConfig()
    host: str = "0.0.0.0"
    port: int = Field(8090, ge=0, le=65535)
    runner_token_file: Path = Field(description="the runners' credential: the coordinator's writes need it")
    lease_ttl_s: float = Field(
        90.0, gt=0, description="a lease its runner stops renewing (the runner died) is handed out again after this long"
    )
    rollout_max_attempts: int = Field(3, ge=1, le=100, description="unscored (infra) attempts before a slot is abandoned")
    metrics_path: Path | None = Field(None, description="JSON lines of per-step metrics; default <checkpoint.dir>/metrics.jsonl")
    log_level: str = Field("info", pattern=r"^(debug|info|warning|error)$")

    @field_validator("harnesses")
    @classmethod
    def _distinct_pools(cls, hs: list[HarnessWeight]) -> list[HarnessWeight]:
        return once_per_pool(hs, "harnesses")

    @model_validator(mode="after")
    def _sync_fits_adapter(self) -> LearnerConfig:
        if self.engine.sync == SyncMode.lora and self.adapter.kind != "lora":
            raise ValueError("engine.sync 'lora' needs adapter.kind 'lora'")
        if self.grpo.beta > 0 and self.adapter.kind != "lora":
            raise ValueError("grpo.beta needs adapter.kind 'lora': the base policy is the adapter switched off")
        if self.engine.sync == SyncMode.nccl and self.adapter.kind != "full":
            raise ValueError("engine.sync 'nccl' pushes full weights: it needs adapter.kind 'full'")
        return self

    def metrics_file(self) -> Path:
        return self.metrics_path or self.checkpoint.dir / "metrics.jsonl"

    def eval_file(self) -> Path:
        """JSON lines of the evaluation rounds (EvalRecord), next to the metrics."""
        return self.metrics_file().with_name("eval.jsonl")

    def tracking_dir(self) -> Path:
        """The trackers' files (TensorBoard's event files, trackio's database, run ids), next to the metrics."""
        return self.metrics_file().with_name("tracking")


def load_config(path: Path) -> LearnerConfig:
    """Read a LearnerConfig from a YAML (or JSON, a YAML subset) file."""
    data = yaml.safe_load(Path(path).read_text())
    return LearnerConfig.model_validate(data or {})
