"""The HarnessPool resource: runners that execute one agent harness on tasks, in sandboxes."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, get_args

from harnessrl.operator.api.common import (
    API_VERSION,
    ApiModel,
    EnvVar,
    Image,
    LabelName,
    ObjectMeta,
    PodOverrides,
    ResourceName,
    ResourceRequirements,
    Rule,
    SecretKeyRef,
    Unique,
    exactly_one,
    name_rule,
)
from harnessrl.operator.api.status import Conditions, conditions_field, kopf_field
from pydantic import Field, StringConstraints

KIND: Final = "HarnessPool"
PLURAL = "harnesspools"

KnownHarnessName = Literal["claude-code", "codex", "opencode", "gemini-cli", "qwen-code", "mini-swe-agent"]
KNOWN_HARNESSES: tuple[str, ...] = get_args(KnownHarnessName)
Dialect = Literal["openai-chat", "openai-responses", "anthropic", "gemini"]


class KnownHarness(ApiModel):
    """A harness harnessrl ships an adapter for."""

    rules = (
        Rule(
            cel="!has(self.dialect) || self.name == 'opencode'",
            message="harness.known.dialect can only be set for opencode (the other harnesses speak one dialect)",
            check=lambda k: k.dialect is None or k.name == "opencode",
        ),
    )

    name: KnownHarnessName = Field(description="Which harness.")
    version: (
        Annotated[
            str, StringConstraints(min_length=1, max_length=64, pattern=r"^[0-9A-Za-z][-0-9A-Za-z.+]*$")
        ]
        | None
    ) = Field(default=None, description="CLI version; the version harnessrl pins when empty.")
    image: Image | None = Field(
        default=None, description="Image with the CLI on its PATH; the operator's harness image when empty."
    )
    dialect: Dialect | None = Field(
        default=None,
        description="For opencode only, which speaks all four: the API dialect it is configured with.",
    )


class CustomHarness(ApiModel):
    """A harness declared entirely here: an image, a command template and the API dialect it speaks."""

    rules = (
        Rule(
            cel="self.command.contains('{instruction}')",
            message="harness.custom.command must contain the {instruction} placeholder",
            check=lambda c: "{instruction}" in c.command,
        ),
    )

    name: LabelName = Field(description="Name of the harness, used in metrics and status.")
    image: Image | None = Field(
        default=None,
        description="Image with the harness on its PATH; the operator's harness image when empty.",
    )
    command: Annotated[str, StringConstraints(min_length=1, max_length=8192)] = Field(
        description="Shell command run in the task's workspace. Placeholders {instruction}, {model}, {base_url}, "
        "{api_key} and {step_budget} are replaced by shell-quoted values."
    )
    dialect: Dialect = Field(description="API dialect the harness speaks to its model endpoint.")
    env: Annotated[list[EnvVar], Unique("name")] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment of the harness process, literals only: the policy being trained runs in the "
        "harness's sandbox and can read it, so no Secret belongs here.",
    )


class HarnessSpec(ApiModel):
    """The agent harness: exactly one of known or custom."""

    rules = (exactly_one("known", "custom"),)

    known: KnownHarness | None = Field(default=None, description="A harness harnessrl knows.")
    custom: CustomHarness | None = Field(
        default=None, description="A harness described by image and command."
    )


class KubernetesSandbox(ApiModel):
    """One Pod per rollout, reaching only the proxy."""

    runtime_class_name: ResourceName | None = Field(
        default=None, description="RuntimeClass of sandbox Pods, e.g. gvisor or kata, for stronger isolation."
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="CPU and memory of each sandbox Pod."
    )
    image: Image | None = Field(
        default=None, description="Image sandbox Pods run; the harness image when empty."
    )
    run_as_user: int = Field(
        default=10001, ge=1, le=2_147_483_647,
        description="Non-root uid sandbox Pods run as (they run under Pod Security restricted); the harness "
        "images' user by default. The task's files and HOME are writable by it.",
    )


class E2BSandbox(ApiModel):
    """One E2B cloud sandbox per rollout."""

    template: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(
        description="E2B template id or name."
    )
    api_key_secret: SecretKeyRef = Field(description="Secret key holding the E2B API key.")
    proxy_url: Annotated[str, StringConstraints(max_length=512, pattern=r"^https?://[^\s]+$")] = Field(
        description="URL at which E2B sandboxes reach the run's capture proxy (an Ingress or LoadBalancer in "
        "front of its Service). It may reach any proxy replica: each relays a call to the replica that holds the "
        "call's session."
    )
    domain: Annotated[str, StringConstraints(min_length=1, max_length=253)] | None = Field(
        default=None, description="E2B domain for self-hosted E2B; e2b.app when empty."
    )


class LocalSandbox(ApiModel):
    """A subprocess in a fresh directory on the runner itself, in bubblewrap namespaces with rlimits (development only)."""

    cpu_seconds: int = Field(
        default=3600, ge=1, le=604_800, description="CPU time limit of the harness process."
    )
    memory_mib: int = Field(
        default=16384, ge=64, le=1_048_576, alias="memoryMiB", description="Address-space limit per process."
    )
    network: Literal["proxy", "host"] = Field(
        default="proxy",
        description="proxy: a network namespace that reaches only the run's capture proxy; host: the runner's network.",
    )
    allow_unisolated: bool = Field(
        default=False,
        description="Run harnesses as plain subprocesses where bubblewrap or user namespaces are missing, instead of "
        "refusing to start. They can then read everything the runner's user can.",
    )


class SandboxSpec(ApiModel):
    """Where a rollout's harness and grader run: exactly one of kubernetes, e2b or local."""

    rules = (exactly_one("kubernetes", "e2b", "local"),)

    kubernetes: KubernetesSandbox | None = Field(default=None, description="A Pod per rollout.")
    e2b: E2BSandbox | None = Field(default=None, alias="e2b", description="An E2B sandbox per rollout.")
    local: LocalSandbox | None = Field(default=None, description="A subprocess on the runner.")


class Timeouts(ApiModel):
    """Wall-clock limits of one rollout."""

    harness_seconds: int = Field(default=1800, ge=10, le=86_400, description="Limit of the harness run.")
    grader_seconds: int = Field(default=600, ge=10, le=86_400, description="Limit of the task's tests.")


class HarnessPoolSpec(ApiModel):
    """Desired state of a HarnessPool."""

    harness: HarnessSpec = Field(description="The agent harness the pool runs.")
    sandbox: SandboxSpec = Field(
        default_factory=lambda: SandboxSpec(kubernetes=KubernetesSandbox()),
        description="Where rollouts run; a Pod per rollout by default.",
    )
    replicas: int = Field(
        default=1, ge=0, le=256,
        description="Runner Pods across every active TrainingRun using the pool, split evenly among them, at least "
        "one each unless 0 (the scale subresource: kubectl scale and an HPA size the pool, not each run).",
    )
    concurrency: int = Field(default=8, ge=1, le=1024, description="Rollouts each runner runs at once.")
    timeouts: Timeouts = Field(default_factory=Timeouts, description="Per-rollout time limits.")
    step_budget: int = Field(
        default=50,
        ge=1,
        le=100_000,
        description="Model calls per rollout; the harness is told and the proxy enforces it.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="CPU and memory of each runner Pod."
    )
    pod: PodOverrides = Field(default_factory=PodOverrides, description="Scheduling settings of runner Pods.")


class PrefixBreaks(ApiModel):
    """Model calls whose prompt did not extend an earlier call's sequence, by where it left the earlier calls."""

    retry: int = Field(default=0, ge=0, description="An earlier call's prompt again.")
    reply_changed: int = Field(
        default=0, ge=0,
        description="An earlier reply resent with other tokens (re-tokenised, thinking stripped, re-serialised "
        "or cut) that token splicing could not restore.",
    )
    history_changed: int = Field(
        default=0, ge=0,
        description="Text the harness wrote changed: another system prompt or tools (a side call, a sub-agent), "
        "a compacted or edited history, or another message after the same reply.",
    )


class PoolCapture(ApiModel):
    """What the pool's scored training rollouts captured for the learner."""

    rollouts: int = Field(default=0, ge=0, description="Scored training rollouts.")
    sequences: int = Field(
        default=0, ge=0,
        description="Training sequences taken from them: one per rollout, plus one per prefix break.",
    )
    sampled_tokens: int = Field(default=0, ge=0, description="Sampled tokens in those sequences: what the loss trains.")


class PoolRolloutCounts(ApiModel):
    """Rollouts run by the pool, by outcome."""

    active: int = Field(default=0, ge=0, description="Rollouts running now.")
    completed: int = Field(default=0, ge=0, description="Rollouts graded.")
    failed: int = Field(default=0, ge=0, description="Rollouts that ended in an error.")
    timed_out: int = Field(default=0, ge=0, description="Rollouts stopped by a timeout.")
    grader_failures: int = Field(
        default=0, ge=0,
        description="Of failed: rollouts whose grader timed out or wrote no reward on the candidate's work (scored 0).",
    )
    unknown_tool_calls: int = Field(
        default=0, ge=0, description="Tool calls to a tool the harness did not offer (another harness's tool)."
    )
    invalid_tool_calls: int = Field(default=0, ge=0, description="Tool calls the tool's argument schema refused.")
    prefix_breaks: PrefixBreaks = Field(
        default_factory=lambda: PrefixBreaks(),
        description="Model calls that started one more training sequence than the rollout's first call, by cause.",
    )
    capture: PoolCapture = Field(
        default_factory=lambda: PoolCapture(),
        description="Training sequences and sampled tokens of the scored training rollouts; sequences per "
        "rollout is `sequences / rollouts`.",
    )


class HarnessPoolStatus(ApiModel):
    """Observed state of a HarnessPool, written by the operator."""

    phase: Literal["Pending", "Ready", "Degraded"] | None = Field(
        default=None, description="Summary of the conditions."
    )
    observed_generation: int = Field(default=0, ge=0, description="metadata.generation last acted on.")
    conditions: Conditions = conditions_field("Ready.")
    replicas: int = Field(default=0, ge=0, description="Runner Pods that exist (the scale subresource).")
    ready_replicas: int = Field(default=0, ge=0, description="Runner Pods that are ready.")
    selector: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        default=None, description="Label selector of the runner Pods, for the scale subresource."
    )
    rollouts: PoolRolloutCounts = Field(default_factory=PoolRolloutCounts, description="Rollout counters.")
    harness_version: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        default=None,
        description="Version of the known harness's CLI the runners run: the one harnessrl pins when "
        "spec.harness.known.version is empty.",
    )
    kopf: dict[str, Any] | None = kopf_field()


class HarnessPool(ApiModel):
    """A pool of runners executing one agent harness on leased tasks."""

    rules = (name_rule(KIND),)

    api_version: Literal["harnessrl.io/v1alpha1"] = Field(
        default=API_VERSION, description="harnessrl.io/v1alpha1"
    )
    kind: Literal["HarnessPool"] = Field(default=KIND, description="HarnessPool")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: HarnessPoolSpec = Field(description="Desired state.")
    status: HarnessPoolStatus | None = Field(default=None, description="Observed state.")
