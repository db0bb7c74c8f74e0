"""RunnerConfig: everything `harnessrl runner --config FILE` needs (YAML or JSON, rendered by the operator
from a HarnessPool and its TrainingRun).

The coordinator's lease names the model and the proxy to use for each rollout; `model` and `proxy_url` here are
the values used when a lease leaves them empty and by `harnessrl eval`-style direct runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from harnessrl.runtime.contracts.server_limits import ServerLimits
from pydantic import BaseModel, ConfigDict, Discriminator, Field, HttpUrl, Tag, model_validator

# The four wire dialects the capture proxy speaks (names as in runtime/proxy/dialects/routes.py).
Dialect = Literal["openai_chat", "openai_responses", "anthropic", "gemini"]
KnownHarness = Literal["claude-code", "codex", "opencode", "gemini-cli", "qwen-code", "mini-swe-agent"]
Name = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KnownHarnessSpec(_Model):
    """One of the harnesses harnessrl ships an adapter for (runtime/harness/adapters/)."""

    kind: Literal["known"] = "known"
    name: KnownHarness
    # None = the version pinned in versions.json; anything else must equal it (the adapter knows that CLI).
    version: str | None = None
    # Image for the kubernetes sandbox (the CLI must be on its PATH); None = the operator's default harness image.
    image: str | None = None
    # For OpenCode, which can speak all four dialects: which provider to configure. Others have exactly one.
    dialect: Dialect | None = None


# What a custom harness command template may name; see adapters/custom.py.
PLACEHOLDERS = ("instruction", "model", "base_url", "api_key", "step_budget", "workspace")


class CustomHarnessSpec(_Model):
    """A harness declared entirely in the pool spec: no code.

    `command` is a template with {instruction}, {model}, {base_url}, {api_key} and {step_budget} placeholders,
    each substituted as one shell-quoted word; the command runs with `sh -c` in the workspace.
    """

    kind: Literal["custom"] = "custom"
    name: Name
    command: str = Field(min_length=1, max_length=8192)
    dialect: Dialect
    image: str | None = None
    env: dict[str, str] = Field(default_factory=dict, max_length=128)

    @model_validator(mode="after")
    def _has_instruction(self) -> CustomHarnessSpec:
        if "{instruction}" not in self.command:
            raise ValueError("custom harness command must contain the {instruction} placeholder")
        try:
            self.command.format_map(dict.fromkeys(PLACEHOLDERS, ""))
        except (KeyError, IndexError, ValueError) as exc:
            # Caught here, a bad template is a config error at start, not a failure of every rollout.
            raise ValueError(
                f"custom harness command is not a valid template ({exc!r}): placeholders are "
                f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}; write literal braces as {{{{ and }}}}"
            ) from None
        return self


def _kind_or(default: str) -> Callable[[Any], str]:
    """Discriminate a union on `kind`, which may be left out of the input (then `default`)."""

    def pick(value: Any) -> str:
        kind = value.get("kind", default) if isinstance(value, dict) else getattr(value, "kind", default)
        return str(kind)

    return pick


HarnessSpec = Annotated[
    Annotated[KnownHarnessSpec, Tag("known")] | Annotated[CustomHarnessSpec, Tag("custom")],
    Discriminator(_kind_or("known")),
]


class LocalSandboxConfig(_Model):
    """A fresh workspace and HOME per rollout under `base_dir`; the harness runs in bubblewrap namespaces
    (sandboxes/bwrap.py) with rlimits."""

    kind: Literal["local"] = "local"
    base_dir: Path = Path("/tmp/harnessrl-rollouts")
    # RLIMIT_CPU of the harness process tree's leader (seconds of CPU, not wall time).
    cpu_seconds: int = Field(3600, ge=1)
    # RLIMIT_DATA per process (heap and private writable mappings); None = no limit.
    memory_mb: int | None = Field(16384, ge=64)
    # RLIMIT_NPROC: it counts every process and thread of the harness's uid (per user, not per rollout).
    max_processes: int | None = Field(4096, ge=8, description="RLIMIT_NPROC; None = inherit")
    # RLIMIT_FSIZE: the largest file a harness may write; None = no limit.
    max_file_mb: int | None = Field(4096, ge=1)
    # All a rollout's files together (checked every few seconds while a command runs; over it the command is
    # killed and the rollout fails as the harness's doing); None = no limit.
    max_disk_mb: int | None = Field(10240, ge=1)
    # "proxy": a network namespace that reaches only the session's proxy; "host": the runner's network.
    network: Literal["proxy", "host"] = "proxy"
    # Without bubblewrap (or user namespaces) the runner refuses to start unless this is set; then rollouts run
    # as plain subprocesses that can read anything the runner's user can.
    allow_unisolated: bool = False
    # Directories the harness may read besides the system, PATH's tools and the runner's Python.
    read_only_paths: list[Path] = Field(default_factory=list, max_length=64)
    # A root runner runs harnesses as this uid and gid (RLIMIT_NPROC does not bind root).
    run_as_uid: int = Field(65534, ge=1)
    # Keep the rollout directory after teardown (debugging only).
    keep: bool = False


class Resources(_Model):
    requests: dict[str, str] = Field(default_factory=dict, max_length=16)
    limits: dict[str, str] = Field(default_factory=dict, max_length=16)


class KubernetesSandboxConfig(_Model):
    """One Pod per rollout plus a NetworkPolicy that lets it reach only the proxy (and DNS)."""

    kind: Literal["kubernetes"] = "kubernetes"
    namespace: Name = "default"
    image: str = Field(min_length=1, max_length=512)
    runtime_class_name: str | None = Field(None, max_length=253)
    # The non-root uid the sandbox Pod runs as (Pod Security "restricted" forbids root).
    run_as_user: int = Field(10001, ge=1, le=2_147_483_647)
    resources: Resources = Resources()
    service_account_name: str | None = Field(None, max_length=253)
    node_selector: dict[str, str] = Field(default_factory=dict, max_length=32)
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    # What every sandbox Pod's name starts with: `<run>.<pool>.`, the one prefix the chart's admission policy lets
    # this pool's runners exec into and reserves to them (operator/plan.py sandbox_name_prefix).
    name_prefix: str = Field(min_length=2, max_length=200, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\.$")
    # Pods the sandbox may reach: the proxy's pod labels and port.
    proxy_pod_labels: dict[str, str] = Field(min_length=1, max_length=16)
    proxy_port: int = Field(8080, ge=1, le=65535)
    # The last of the proxy's ports when its replicas run workers (each serves its sessions at a port after it).
    proxy_end_port: int | None = Field(None, ge=1, le=65535)
    # Namespace of the proxy's pods; None = the sandbox's namespace.
    proxy_namespace: str | None = Field(None, max_length=63)
    # Where the task's files live in the pod (an image source resolves tasks there).
    workdir: str = "/workspace"
    pod_start_timeout_s: float = Field(300.0, gt=0)
    # Path to a kubeconfig; None = in-cluster config, else KUBECONFIG.
    kubeconfig: Path | None = None


class E2BSandboxConfig(_Model):
    """One E2B sandbox per rollout; it reaches the proxy at the pool's public URL."""

    kind: Literal["e2b"] = "e2b"
    template: str = Field(min_length=1, max_length=253)
    api_key_file: Path
    proxy_public_url: HttpUrl
    domain: str | None = None
    sandbox_timeout_s: int = Field(3600, ge=60)
    workdir: str = "/home/user/workspace"


SandboxConfig = Annotated[
    Annotated[LocalSandboxConfig, Tag("local")]
    | Annotated[KubernetesSandboxConfig, Tag("kubernetes")]
    | Annotated[E2BSandboxConfig, Tag("e2b")],
    Discriminator(_kind_or("local")),
]


class DirTasks(_Model):
    kind: Literal["dir"] = "dir"
    path: Path


class HubTasks(_Model):
    """A Hub dataset in Harbor's layout, fetched with huggingface_hub.snapshot_download (honours HF_ENDPOINT)."""

    kind: Literal["hub"] = "hub"
    repo_id: str = Field(min_length=1, max_length=256)
    repo_type: Literal["dataset", "model"] = "dataset"
    revision: str | None = None
    subdir: str = ""
    token_file: Path | None = None
    cache_dir: Path | None = None


class ImageTasks(_Model):
    """Tasks baked into an OCI image: the operator mounts the image into the runner's pod (an image volume)
    at `path`, where the runner reads them as a directory. Only in a cluster, so only with the kubernetes
    sandbox."""

    kind: Literal["image"] = "image"
    image: str = Field(min_length=1, max_length=512)
    path: str = "/tasks"


TaskSource = Annotated[DirTasks | HubTasks | ImageTasks, Field(discriminator="kind")]


class Timeouts(_Model):
    harness_s: float = Field(1800.0, gt=0, description="wall-clock limit of one harness run")
    grader_s: float = Field(600.0, gt=0, description="wall-clock limit of the task's tests/test.sh")
    session_s: float = Field(30.0, gt=0, description="HTTP calls to the proxy and the coordinator")


class RunnerConfig(_Model):
    pool: Name
    runner_id: str = Field("runner-0", min_length=1, max_length=253)
    harness: HarnessSpec
    sandbox: SandboxConfig = LocalSandboxConfig()
    tasks: TaskSource
    concurrency: int = Field(4, ge=1, le=1024, description="rollouts this runner runs at once")
    timeouts: Timeouts = Timeouts()
    step_budget: int = Field(50, ge=1, le=100_000, description="model calls per rollout (the proxy enforces it)")
    coordinator_url: HttpUrl
    proxy_url: HttpUrl | None = None
    runner_token_file: Path = Field(
        description="this run's runner credential, sent on every coordinator call and the proxy's session routes"
    )
    model: str | None = Field(None, min_length=1, max_length=512)
    # An infra error is retried this many times in place before the rollout is completed as infra_error.
    infra_retries: int = Field(1, ge=0, le=10)
    log_level: str = Field("info", pattern=r"^(debug|info|warning|error)$")
    metrics_port: int | None = Field(None, ge=1, le=65535, description="serve Prometheus /metrics here")
    # The metrics server's limits on each connection's request head (runtime/serving.py).
    http: ServerLimits = ServerLimits()

    @model_validator(mode="after")
    def _image_tasks_need_kubernetes(self) -> RunnerConfig:
        if isinstance(self.tasks, ImageTasks) and not isinstance(self.sandbox, KubernetesSandboxConfig):
            raise ValueError("tasks.kind=image is mounted into the runner's pod: it needs the kubernetes sandbox")
        return self


def load_config(path: Path) -> RunnerConfig:
    """Read a RunnerConfig from a YAML (or JSON) file."""
    data = yaml.safe_load(Path(path).read_text())
    return RunnerConfig.model_validate(data or {})
