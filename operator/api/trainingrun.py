"""The TrainingRun resource: one GRPO run of a model across one or more HarnessPools."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Final, Literal

from harnessrl.operator.api.common import (
    API_VERSION,
    ApiModel,
    Arg,
    HubRepo,
    Image,
    ObjectMeta,
    PodOverrides,
    ResourceName,
    ResourceRequirements,
    Revision,
    Rule,
    SecretEnvVar,
    SecretKeyRef,
    Unique,
    VolumePath,
    exactly_one,
    immutable,
    name_rule,
    queue_name_field,
)
from harnessrl.operator.api.status import Conditions, conditions_field, kopf_field
from pydantic import Field, StringConstraints

KIND: Final = "TrainingRun"
PLURAL = "trainingruns"

Split = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")
]
Url = Annotated[str, StringConstraints(max_length=512, pattern=r"^https?://[^\s]+$")]
DEFAULT_ENGINE_IMAGE = "vllm/vllm-openai:v0.32.0"
DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class HubSource(ApiModel):
    """A repository on the Hugging Face Hub."""

    repo: HubRepo = Field(
        description='Repository id, "namespace/name": a model repository for weights, a dataset one for tasks.'
    )
    revision: Revision = Field(default="main", description="Branch, tag or commit to use.")
    token_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding a Hub token that can read the repository (a gated or private one); "
        "none for a public repository. Mounted as a file where the repository is downloaded, never a literal.",
    )


class ImageSource(ApiModel):
    """An OCI image whose filesystem holds the task set."""

    image: Image = Field(description="Image reference, e.g. ghcr.io/org/tasks:v1.")
    path: Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^/")] = Field(
        default="/tasks", description="Absolute directory inside the image that holds the tasks."
    )


class BaseModelSource(ApiModel):
    """Where the base weights come from: exactly one of hub or pvc."""

    rules = (exactly_one("hub", "pvc"),)

    hub: HubSource | None = Field(default=None, description="Download the weights from the Hub.")
    pvc: VolumePath | None = Field(default=None, description="Read the weights from a PersistentVolumeClaim.")


class LoraAdapter(ApiModel):
    """Train a LoRA adapter on top of frozen base weights."""

    rank: int = Field(default=16, ge=1, le=1024, description="LoRA rank r.")
    alpha: int = Field(
        default=32, ge=1, le=4096, description="LoRA scaling alpha (the update is scaled by alpha/r)."
    )
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: Annotated[
        list[Annotated[str, StringConstraints(min_length=1, max_length=128)]], Unique()
    ] = Field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS),
        min_length=1,
        max_length=64,
        description="Names of the linear modules that get an adapter.",
    )


class FullFineTune(ApiModel):
    """Train every weight. Needs engine.weightSync nccl or restart."""


class AdapterSpec(ApiModel):
    """What is trained: exactly one of lora or full."""

    rules = (exactly_one("lora", "full"),)

    lora: LoraAdapter | None = Field(default=None, description="Train a LoRA adapter.")
    full: FullFineTune | None = Field(default=None, description="Train all weights.")


class ServedModel(ApiModel):
    """Base weights as the engines serve them."""

    base: BaseModelSource = Field(
        description="Base weights. Immutable: a run's checkpoints only make sense on its own base.",
        json_schema_extra=immutable("model.base"),
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="Weight dtype for serving and training."
    )
    served_name: Annotated[
        str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_./]*$")
    ] = Field(
        default="policy",
        description="Model name the harnesses ask for; the proxy routes it to the current policy.",
    )


class ModelSpec(ServedModel):
    """The policy being trained."""

    adapter: AdapterSpec = Field(
        default_factory=lambda: AdapterSpec(lora=LoraAdapter()),
        description="What is trained; LoRA by default. Immutable: checkpoints hold this adapter's weights.",
        json_schema_extra=immutable("model.adapter"),
    )


class TaskSource(ApiModel):
    """A Harbor-format task set: exactly one of hub, pvc or image."""

    rules = (exactly_one("hub", "pvc", "image"),)

    hub: HubSource | None = Field(default=None, description="A dataset repository on the Hub.")
    pvc: VolumePath | None = Field(default=None, description="A directory in a PersistentVolumeClaim.")
    image: ImageSource | None = Field(default=None, description="A directory in an OCI image.")
    split: Split = Field(default="train", description="Split trained on.")
    limit: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Use at most this many tasks (the first in name order)."
    )


class HarnessRef(ApiModel):
    """A HarnessPool the run draws rollouts from, and how often."""

    pool: ResourceName = Field(description="Name of a HarnessPool in the run's namespace.")
    weight: int = Field(
        default=1, ge=1, le=1000, description="Relative share of GRPO groups given to this pool's harness."
    )


class GrpoSpec(ApiModel):
    """Group-relative policy optimisation settings."""

    rules = (
        Rule(
            cel="self.clipHigh >= self.clipLow",
            message="grpo.clipHigh must be greater than or equal to grpo.clipLow",
            check=lambda g: g.clip_high >= g.clip_low,
        ),
        Rule(
            cel="self.lossType != 'cispo' || self.clipHigh >= 1.0",
            message="grpo.clipHigh is CISPO's weight cap: it must be at least 1",
            check=lambda g: g.loss_type != "cispo" or g.clip_high >= 1.0,
        ),
        Rule(
            cel="!has(self.vllmImportanceSamplingClipMin) || "
            "self.vllmImportanceSamplingClipMin <= self.vllmImportanceSamplingClipMax",
            message="grpo.vllmImportanceSamplingClipMin must be less than or equal to vllmImportanceSamplingClipMax",
            check=lambda g: g.vllm_importance_sampling_clip_min is None
            or g.vllm_importance_sampling_clip_min <= g.vllm_importance_sampling_clip_max,
        ),
    )

    group_size: int = Field(
        default=8,
        ge=2,
        le=256,
        description="Rollouts per group: one task under one harness, this many times.",
    )
    batch: int = Field(default=4, ge=1, le=1024, description="Groups per optimiser step.")
    steps: int = Field(
        default=100, ge=1, le=1_000_000, description="Optimiser steps before the run completes."
    )
    max_staleness: int = Field(
        default=1000,
        ge=0,
        le=1000,
        description="Last resort: drop rollouts sampled more than this many policy versions ago. Below it a stale "
        "rollout is kept and each token corrected by its importance weight (vllmImportanceSampling*): dropping "
        "starves the slow rollouts, which are the hard tasks.",
    )
    learning_rate: float = Field(default=1e-5, gt=0.0, le=1.0, description="Optimiser learning rate.")
    clip_low: float = Field(
        default=0.2, ge=0.0, le=1.0, description="Lower clip epsilon: the ratio is clipped at 1 - clipLow."
    )
    clip_high: float = Field(
        default=0.28, ge=0.0, le=10.0, description="Upper clip epsilon: the ratio is clipped at 1 + clipHigh."
    )
    max_tokens_per_step: int | None = Field(
        default=None,
        ge=16,
        le=1_000_000_000,
        description="Most tokens one optimiser update trains on; a step with more is split, in order, into "
        "several updates (nothing is dropped). One update per step when empty. The size of a forward pass is "
        "learner.microBatchTokens.",
    )
    loss_type: Literal["dapo", "grpo", "dr_grpo", "cispo"] = Field(
        default="dapo",
        description="How token losses are averaged (TRL's loss_type): dapo over every loss token of the update; "
        "grpo per sequence, then over sequences (favours short sequences); dr_grpo summed per sequence over a "
        "constant length (engine.maxModelLen, or 32768); cispo, CISPO's loss: each token's log-probability "
        "gradient weighted by its ratio capped at clipHigh (then the cap, 5 recommended), averaged as dapo.",
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        default="token",
        description="The ratio the clip acts on (TRL's importanceSamplingLevel): per token, or one per sequence, "
        "the geometric mean of its tokens' ratios (GSPO).",
    )
    baseline: Literal["mean", "rloo"] = Field(
        default="mean",
        description="Advantage baseline: the group's mean reward, or the mean of the group's other rewards "
        "(RLOO); scaleRewards applies to either.",
    )
    loss_balance: Literal["token", "rollout", "harness"] = Field(
        default="token",
        description="What share of an update's loss each rollout carries: token, as lossType averages it (a "
        "rollout weighs its tokens, or its sequences under grpo); rollout, one equal share per rollout however "
        "many sequences and tokens it captured; harness, one equal share per harness, then per rollout within "
        "it. token by default: every sampled token's gradient counts the same, with no length bias; rollout or "
        "harness when a harness with long or split rollouts would otherwise dominate a multi-harness run.",
    )
    scale_rewards: Literal["batch", "group", "none"] = Field(
        default="batch",
        description="Advantage = reward − group mean, divided by the std of every reward in the step (batch), "
        "of the group (group), or not at all (none; Dr. GRPO). batch by default: per-group std turns an "
        "all-solved group's small efficiency-bonus differences into advantages larger than solving a task.",
    )
    beta: float = Field(
        default=0.0,
        ge=0.0,
        le=100.0,
        description="KL penalty to the base policy (TRL's beta): beta times a k3 estimate of KL(π‖π_base) per token "
        "is added to the loss. The base is the LoRA adapter switched off (one more forward pass per micro-batch); "
        "it needs model.adapter.lora. Off at 0.",
    )
    vllm_importance_sampling_correction: bool = Field(
        default=True,
        description="Correct off-policy tokens (TRL's name): the clip is taken against the learner's policy before "
        "the step, and each token's loss is weighted by π_learner/π_engine, the engine's logprob recorded with "
        "the token being its own behaviour policy however many versions old, bounded as "
        "vllmImportanceSamplingMode says. Free with one update per step; otherwise one extra forward pass.",
    )
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = (
        Field(
            default="token_truncate",
            description="Bound on the importance weight: per token or one per sequence (the product of its "
            "tokens'), truncated into [clipMin, clipMax] or set to 0 outside it (token_mask is IcePop's masking). "
            "token_truncate by default, unlike TRL: a long agent rollout's sequence ratio nearly always leaves "
            "the band, which would drop stale rollouts whole.",
        )
    )
    vllm_importance_sampling_clip_min: float | None = Field(
        default=None, ge=0.0, le=1000.0, description="Lower bound of the importance weight; none when empty."
    )
    vllm_importance_sampling_clip_max: float = Field(
        default=3.0, gt=0.0, le=1000.0, description="Upper bound of the importance weight."
    )
    max_grad_norm: float = Field(
        default=1.0,
        ge=0.0,
        le=1_000_000.0,
        description="Clip the gradient's global norm to this before each optimiser step; 0 turns clipping off.",
    )
    temperature: float = Field(
        default=1.0,
        gt=0.0,
        le=2.0,
        description="Sampling temperature of training rollouts, whatever the harness asks for; the learner scores "
        "tokens at the same temperature. Evaluation rollouts keep the harness's own sampling.",
    )
    seed: int = Field(
        default=0,
        ge=0,
        le=2_147_483_647,
        description="Seed of task order, harness rotation and a new adapter's initial weights.",
    )
    seeded_sampling: bool = Field(
        default=False,
        description="Seed every engine call with a seed derived from seed, the rollout and the call's index, so a "
        "call repeats token for token under the same policy version where the engine's logits do not depend on "
        "what it batches the call with. Off by default: vLLM draws a seeded request's noise one request at a "
        "time, slower on GPUs than its batched sampling.",
    )


class RewardSpec(ApiModel):
    """Reward = correctness × (1 + bonus × scale / (scale + toolCalls)), the bonus only for correct answers,
    minus toolMismatchPenalty per tool call the harness cannot run (at most 1 in all)."""

    bonus: float = Field(default=0.1, ge=0.0, le=10.0, description="Weight b of the tool-efficiency bonus.")
    scale: float = Field(
        default=15.0, gt=0.0, le=1_000_000.0, description="Tool-call count s at which the bonus halves."
    )
    tool_mismatch_penalty: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Subtracted from a rollout's reward for each tool call its harness cannot run: a tool the "
        "call did not offer (another harness's tool), or arguments the tool's schema refuses; at most 1 per "
        "rollout. 0 (off) by default: such calls are counted in the pools' status either way.",
    )


class EngineServers(ApiModel):
    """vLLM inference servers: image, count and size."""

    image: Image = Field(default=DEFAULT_ENGINE_IMAGE, description="vLLM OpenAI-server image.")
    args: list[Arg] = Field(default_factory=list, max_length=64, description="Extra vLLM server arguments.")
    env: Annotated[list[SecretEnvVar], Unique("name")] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment of the vLLM container: literals, or keys of Secrets (e.g. the object store "
        "credentials of a model streamed from S3).",
    )
    replicas: int = Field(default=1, ge=1, le=64, description="Number of vLLM servers.")
    gpus: int = Field(
        default=1, ge=0, le=16, description="GPUs per server (tensor parallel size); 0 runs on CPU."
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="CPU and memory of each server (GPUs come from gpus).",
    )
    max_model_len: int | None = Field(
        default=None, ge=256, le=4_194_304, description="Context length served; the model's own when empty. At "
        "most the positions its config allows (max_position_embeddings, times its rope scaling): the operator refuses "
        "more (ContextTooLong) for a model it knows the config of, `harnessrl run` for any, unless env sets "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Share of GPU memory vLLM may use."
    )


class EngineSpec(EngineServers):
    """The vLLM inference servers."""

    weight_sync: Literal["lora", "nccl", "restart"] = Field(
        default="lora",
        description="How new weights reach the servers: hot-load a LoRA adapter, broadcast over NCCL, "
        "or restart the servers from the checkpoint (`harnessrl run` only).",
    )
    pool: ResourceName | None = Field(
        default=None,
        description="An EnginePool in the run's namespace to sample from instead of servers of the run's own: "
        "its servers serve this run's LoRA adapter (named after the run) beside other runs' adapters, and the "
        "fields above are unused. The pool's model.base must be the run's. In a cluster only.",
    )


class ProxySpec(ApiModel):
    """The capture proxy between harnesses and vLLM."""

    replicas: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Number of proxy replicas; sessions are sharded. Immutable: each replica keeps its own "
        "sessions and journal, and the learner sets the served policy on the replicas the run started with.",
        json_schema_extra=immutable("proxy.replicas"),
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Worker processes per replica, each serving the sessions it creates at its own port (the "
        "replica's port + 1 + K); one event loop serves about one core's worth of calls, so about one per CPU "
        "of `resources`. Immutable: each worker keeps its own journal.",
        json_schema_extra=immutable("proxy.workers"),
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="CPU and memory of each replica."
    )
    call_budget: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="Most model calls one session may make; later calls get an error in the harness's dialect.",
    )
    max_tokens_per_call: int | None = Field(
        default=None,
        ge=1,
        le=1_048_576,
        description="Cap on the completion tokens of every model call; empty for the harness's own limit.",
    )
    max_sessions_per_replica: int = Field(
        default=512,
        ge=1,
        le=100_000,
        description="Live sessions one replica accepts before it refuses new ones.",
    )
    journal_fsync: bool = Field(
        default=True,
        description="Sync each captured turn to the proxy's volume before its answer reaches the harness, so it "
        "survives the node's crash; false only hands it to the operating system (it survives the proxy's "
        "crash, not the node's) and saves ~0.1 ms of CPU and a disk flush per call.",
    )
    journal_commit_delay_milliseconds: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="Group commit: how long a turn's sync may wait for the calls in flight to capture theirs, so that "
        "one sync covers them all. Less CPU per call, more latency (2 ms in the proxy benchmark: 6-9% less CPU, "
        "2-3.5x the p99 latency the proxy adds); 0 syncs at once.",
    )


class LearnerSpec(ApiModel):
    """The learner: coordinator, GRPO steps, checkpoints."""

    gpus: int = Field(
        default=1, ge=0, le=64, description="GPUs of each learner Pod; 0 trains on CPU; > 1 runs torchrun with FSDP2."
    )
    nodes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Learner Pods (one per node); > 1 runs them as a JobSet (needs the JobSet controller, jobset.x-k8s.io) "
        "on a ReadWriteMany checkpoint claim (the run's own asks for one; a named one without it is refused).",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="CPU and memory of the learner Pod."
    )
    micro_batch_tokens: int = Field(
        default=16384,
        ge=16,
        le=4_194_304,
        description="Tokens of one forward/backward pass; gradients accumulate over a step's micro-batches, so "
        "the update is the same for any value. A sequence longer than this is a micro-batch of its own.",
    )
    gradient_checkpointing: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Recompute activations in the backward pass (less memory, ~30% more compute). auto: on "
        "when the learner trains on GPUs and the memory plan without it does not fit (or the model's shape is "
        "not known to the operator); off on CPU.",
    )
    gpu_memory_gib: int = Field(
        default=80,
        ge=1,
        le=4096,
        description="Memory of each learner GPU. The operator refuses a spec whose memory plan (weights, "
        "optimizer states, activations of the largest micro-batch, logits) exceeds it, when it knows the model's "
        "shape (a Qwen3 model from the Hub).",
    )
    checkpoint_every: int = Field(
        default=50, ge=1, le=1_000_000, description="Save a checkpoint every N steps."
    )
    keep_checkpoints: int = Field(
        default=3, ge=1, le=1000, description="Checkpoints kept; older ones are deleted."
    )
    restart_budget: int = Field(
        default=3,
        ge=0,
        le=100,
        description="Times the learner may fail and resume from its checkpoint before the run is Failed.",
    )
    checkpoint_claim_name: ResourceName | None = Field(
        default=None,
        description="Your PersistentVolumeClaim for checkpoints (the operator never changes or deletes it; name a "
        "claim an earlier run retained to resume from its checkpoints; a claim another live run holds is refused: "
        "CheckpointClaimInUse). Without it the run gets its own claim, "
        "`<run>-checkpoints`, kept or deleted with the run as checkpointRetention says.",
    )
    checkpoint_retention: Literal["Retain", "Delete"] = Field(
        default="Retain",
        description="What deleting the run does to its own checkpoint claim `<run>-checkpoints` (on a cluster). "
        "Retain: the claim has no ownerReference, so it outlives the run, labelled harnessrl.io/run and "
        "harnessrl.io/run-uid; a new run of the same name does not take it over (its Ready condition says "
        "ChildConflict) until you delete the claim, or name it in checkpointClaimName. Delete: it goes with the "
        "run. The proxy's journal volumes always go with the run.",
    )


class EvalSpec(ApiModel):
    """Periodic pass@1 evaluation; it also runs before the first step and after the last."""

    rules = (
        Rule(
            cel="!has(self.validationSplit) || self.validationSplit != self.split",
            message="eval.validationSplit must differ from eval.split: the checkpoint is picked on one, reported on the other",
            check=lambda e: e.validation_split is None or e.validation_split != e.split,
        ),
    )

    every_steps: int = Field(default=50, ge=1, le=1_000_000, description="Evaluate every N steps.")
    at_start: bool = Field(
        default=True,
        description="Evaluate the base policy before the first step (step 0): the baseline the later rounds and "
        "the report are read against.",
    )
    split: Split = Field(
        default="test", description="Task split evaluated: the held-out pass@1 the model card and report give."
    )
    validation_split: Split | None = Field(
        default=None,
        description="A second held-out split evaluated in the same rounds: the best checkpoint is picked by its "
        "pass@1 and the collapse alarm reads it, so split's pass@1 of the chosen checkpoint is not inflated by "
        "the choice. Empty: both read split.",
    )
    harnesses: Annotated[list[ResourceName], Unique()] = Field(
        default_factory=list,
        max_length=16,
        description="HarnessPools to evaluate under (may include pools not trained on); "
        "every pool in spec.harnesses when empty.",
    )
    limit: int | None = Field(default=None, ge=1, le=100_000, description="Evaluate at most this many tasks.")
    attempts: int = Field(default=1, ge=1, le=64, description="Samples per task; pass@1 is their mean.")


class ExportSpec(ApiModel):
    """Push checkpoints to a Hugging Face Hub model repository."""

    hub_repo: HubRepo = Field(description='Target model repository, e.g. "org/my-agent-model".')
    token_secret: SecretKeyRef = Field(description="Secret key holding a Hub token with write access.")
    every_steps: int = Field(
        default=100, ge=1, le=1_000_000, description="Push every N steps (and after the last step)."
    )
    private: bool = Field(default=True, description="Create the repository as private.")
    endpoint: Url | None = Field(
        default=None, description="Hub endpoint URL; https://huggingface.co when empty."
    )


TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")
Project = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")]


class WandbSpec(ApiModel):
    """Weights & Biases: one run per TrainingRun (named after it) in tracking.project."""

    api_key_secret: SecretKeyRef = Field(description="Secret key holding a W&B API key.")
    entity: Project | None = Field(default=None, description="Team or user the run belongs to; the key's own when empty.")
    base_url: Url | None = Field(default=None, description="URL of a dedicated or self-hosted W&B server; W&B's cloud when empty.")


class MlflowSpec(ApiModel):
    """MLflow: one run per TrainingRun (named after it) in the experiment tracking.project."""

    tracking_uri_secret: SecretKeyRef = Field(
        description="Secret key holding the tracking server's URI (a Secret: a URI may carry credentials)."
    )
    token_secret: SecretKeyRef | None = Field(
        default=None, description="Secret key holding a bearer token for the tracking server; none when empty."
    )


class TrackioSpec(ApiModel):
    """trackio on a Hugging Face Space, where the dashboard is. Without it, trackio keeps its database beside the
    learner's metrics (tracking/trackio on the checkpoint volume)."""

    space_id: HubRepo = Field(description='The Space, "namespace/name"; trackio creates it when missing.')
    token_secret: SecretKeyRef = Field(description="Secret key holding a Hugging Face token that can write to the Space.")


def _listed_with_settings(tracker: str, required: bool) -> Rule:
    """A tracker's settings are given only when reportTo lists it (and, if `required`, whenever it does)."""
    if required:
        return Rule(
            cel=f"('{tracker}' in self.reportTo) == has(self.{tracker})",
            message=f"tracking.{tracker} must be set exactly when tracking.reportTo lists {tracker}",
            check=lambda t: (tracker in t.report_to) == (getattr(t, tracker) is not None),
        )
    return Rule(
        cel=f"!has(self.{tracker}) || '{tracker}' in self.reportTo",
        message=f"tracking.{tracker} is set but tracking.reportTo does not list {tracker}",
        check=lambda t: getattr(t, tracker) is None or tracker in t.report_to,
    )


class TrackingSpec(ApiModel):
    """Experiment tracking, as TRL's report_to: each step's metrics (train/loss, train/mean_reward/<harness>, ...)
    and each evaluation's pass@1 (eval/pass_at_1/<pool>) go to these trackers, besides metrics.jsonl and eval.jsonl."""

    rules = (
        Rule(
            cel="!('none' in self.reportTo) || self.reportTo.size() == 1",
            message="tracking.reportTo: none cannot be listed with a tracker",
            check=lambda t: "none" not in t.report_to or len(t.report_to) == 1,
        ),
        _listed_with_settings("wandb", required=True),
        _listed_with_settings("mlflow", required=True),
        _listed_with_settings("trackio", required=False),
    )

    report_to: Annotated[list[Literal["tensorboard", "wandb", "mlflow", "trackio", "none"]], Unique()] = Field(
        default=["tensorboard"],
        min_length=1,
        max_length=4,
        description="Trackers: tensorboard (event files in tracking/tensorboard on the learner's checkpoint volume), "
        "wandb, mlflow, trackio; none for none. wandb, mlflow and trackio need their package in the learner image "
        "(the run fails with TrackerUnavailable otherwise).",
    )
    project: Project = Field(
        default="harnessrl", description="W&B and trackio project, MLflow experiment; runs are named after the TrainingRun."
    )
    wandb: WandbSpec | None = Field(default=None, description="Weights & Biases settings; needed with reportTo wandb.")
    mlflow: MlflowSpec | None = Field(default=None, description="MLflow settings; needed with reportTo mlflow.")
    trackio: TrackioSpec | None = Field(default=None, description="A Space for trackio; local files when empty.")
    viewer_url: str | None = Field(
        default=None, max_length=2048, pattern=r"^https?://[^\s]+$",
        description="Where `harnessrl view` serves this run (its address, or a port-forward's): each step's rollout "
        "samples in the trackers link to their pages there. Unset: the links are the viewer's paths (/rollouts/ID).",
    )


class TrainingRunSpec(ApiModel):
    """Desired state of a TrainingRun."""

    rules = (
        Rule(
            cel="self.engine.weightSync != 'lora' || has(self.model.adapter.lora)",
            message="engine.weightSync lora needs model.adapter.lora",
            check=lambda s: s.engine.weight_sync != "lora" or s.model.adapter.lora is not None,
        ),
        Rule(
            cel="self.grpo.beta == 0.0 || has(self.model.adapter.lora)",
            message="grpo.beta needs model.adapter.lora: the base policy is the adapter switched off",
            check=lambda s: s.grpo.beta == 0.0 or s.model.adapter.lora is not None,
        ),
        Rule(
            cel="!has(self.engine.pool) || self.engine.weightSync == 'lora'",
            message="engine.pool serves LoRA adapters: engine.weightSync must be lora",
            check=lambda s: s.engine.pool is None or s.engine.weight_sync == "lora",
        ),
        # The learner pushes every Nth checkpoint; a cadence between checkpoints would have to be rounded.
        Rule(
            cel="!has(self.export) || self.export.everySteps % self.learner.checkpointEvery == 0",
            message="export.everySteps must be a multiple of learner.checkpointEvery (an export pushes a checkpoint)",
            check=lambda s: s.export is None or s.export.every_steps % s.learner.checkpoint_every == 0,
        ),
        Rule(
            cel="!has(self.eval) || !has(self.eval.validationSplit) || self.eval.validationSplit != self.tasks.split",
            message="eval.validationSplit must differ from tasks.split: a checkpoint is not picked on tasks it trained on",
            check=lambda s: s.eval is None or s.eval.validation_split is None or s.eval.validation_split != s.tasks.split,
        ),
    )

    model: ModelSpec = Field(description="Base weights and what is trained.")
    tasks: TaskSource = Field(description="Task set rollouts are drawn from.")
    harnesses: Annotated[list[HarnessRef], Unique("pool")] = Field(
        min_length=1,
        max_length=16,
        description="HarnessPools that produce rollouts; groups rotate between them by weight.",
    )
    grpo: GrpoSpec = Field(default_factory=GrpoSpec, description="GRPO settings.")
    reward: RewardSpec = Field(default_factory=RewardSpec, description="Reward shaping.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="Inference engine (vLLM).")
    proxy: ProxySpec = Field(default_factory=ProxySpec, description="Capture proxy.")
    learner: LearnerSpec = Field(default_factory=LearnerSpec, description="Learner.")
    eval: EvalSpec | None = Field(default=None, description="Evaluation; none when empty.")
    export: ExportSpec | None = Field(default=None, description="Export to the Hub; none when empty.")
    tracking: TrackingSpec = Field(
        default_factory=TrackingSpec, description="Experiment tracking; TensorBoard event files by default."
    )
    suspend: bool = Field(
        default=False,
        description="Stop the run's Pods, keeping its state; false resumes from the last checkpoint.",
    )
    queue_name: ResourceName | None = queue_name_field(
        KIND, "the whole run as one Workload (a pod set per component; in a cluster only)"
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        le=31_536_000,
        description="Fail the run (reason DeadlineExceeded) once its learner has run this long; the clock starts "
        "again when a suspended run resumes, as a Job's does. A change applies to the running learner (raise it "
        "rather than removing it). In a cluster only: `harnessrl run` runs until done.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=31_536_000,
        description="Delete the TrainingRun this long after it completes or fails; kept when empty.",
    )
    pod: PodOverrides = Field(
        default_factory=PodOverrides, description="Scheduling settings of every Pod of the run."
    )


class RolloutCounts(ApiModel):
    """Rollouts completed so far, by fate."""

    scored: int = Field(default=0, ge=0, description="Rollouts graded and used in a GRPO step.")
    unscored: int = Field(
        default=0, ge=0, description="Rollouts that ended without a grade (errors, timeouts)."
    )
    stale: int = Field(
        default=0, ge=0, description="Rollouts dropped for being older than grpo.maxStaleness."
    )


class RunUsage(ApiModel):
    """What the run consumed so far, for chargeback (also Prometheus `harnessrl_run_*`, by namespace and run)."""

    gpu_seconds: dict[Literal["learner", "engine"], Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict,
        max_length=2,
        description="GPUs requested by the component's running Pods times their running time, summed.",
    )
    rollouts: int = Field(default=0, ge=0, description="Rollouts finished (training and evaluation, any outcome).")
    sandbox_seconds: float = Field(default=0.0, ge=0, description="Those rollouts' time from start to grade.")
    tokens_sampled: int = Field(
        default=0, ge=0, description="Sampled tokens of the scored training rollouts (what training used)."
    )
    tokens_trained: int = Field(default=0, ge=0, description="Tokens (prompt and sampled) of every optimiser step.")
    # JSON carries times as strings; strict typing would refuse them.
    observed_time: datetime | None = Field(
        default=None, description="Until when gpuSeconds is counted.", strict=False
    )


class TrainingRunStatus(ApiModel):
    """Observed state of a TrainingRun, written by the operator."""

    phase: Literal["Pending", "Running", "Suspended", "Succeeded", "Failed"] | None = Field(
        default=None, description="Summary of the conditions."
    )
    observed_generation: int = Field(default=0, ge=0, description="metadata.generation last acted on.")
    conditions: Conditions = conditions_field("Ready, EngineReady, ProxyReady, HarnessesReady, Training, Complete, Failed, Suspended, SpecApplied.")
    step: int = Field(default=0, ge=0, description="Optimiser steps taken.")
    policy_version: int = Field(default=0, ge=0, description="Version of the weights the engine serves.")
    rollouts: RolloutCounts = Field(default_factory=RolloutCounts, description="Rollout counters.")
    mean_reward: float | None = Field(default=None, description="Mean reward of the last step's rollouts.")
    pass_at1: dict[str, Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        default_factory=dict,
        max_length=64,
        description="pass@1 of the latest evaluation, by HarnessPool name.",
    )
    latest_checkpoint: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        default=None, description="Path of the latest checkpoint in the learner's storage."
    )
    hub_revision: Annotated[str, StringConstraints(max_length=256)] | None = Field(
        default=None, description="Hub commit of the latest export."
    )
    usage: RunUsage = Field(default_factory=RunUsage, description="Resources consumed so far (chargeback).")
    # JSON carries times as strings; strict typing would refuse them.
    start_time: datetime | None = Field(default=None, description="When the first step started.", strict=False)
    completion_time: datetime | None = Field(default=None, description="When the run completed or failed.", strict=False)
    kopf: dict[str, Any] | None = kopf_field()


class TrainingRun(ApiModel):
    """A GRPO training run of a coding-agent model inside one or more agent harnesses."""

    rules = (name_rule(KIND),)

    api_version: Literal["harnessrl.io/v1alpha1"] = Field(
        default=API_VERSION, description="harnessrl.io/v1alpha1"
    )
    kind: Literal["TrainingRun"] = Field(default=KIND, description="TrainingRun")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: TrainingRunSpec = Field(description="Desired state.")
    status: TrainingRunStatus | None = Field(default=None, description="Observed state.")
