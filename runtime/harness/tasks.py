"""Tasks in Harbor's format, and where they come from (a directory, a Hub dataset snapshot).

A task is a directory:

    task.toml        configuration: [metadata] (split = "train" | "validation" | "test", free-form keys), [agent] timeout_sec,
                     [verifier] timeout_sec, env, [environment] resources (used by container sandboxes)
    instruction.md   the prompt the harness gets, verbatim
    environment/     the agent's starting files: copied into its workspace (Harbor builds a container from a
                     Dockerfile here; we run the harness in a sandbox instead, so the files are what matters)
    tests/test.sh    the verifier, run after the agent finishes, with tests/ copied in only then; it writes
                     $LOGS_DIR/verifier/reward.txt (a number) or reward.json ({"reward": x, ...})
    solution/solve.sh  the reference answer (Harbor's oracle): run in a fresh sandbox when the verifier fails on a
                     candidate, to tell a broken grader from a candidate that broke it (runtime/harness/runner.py)

Harbor's containers have the workspace at /workspace and the logs at /logs. The local sandbox has neither, so
test.sh gets them as env: WORKSPACE (its cwd too), TESTS_DIR and LOGS_DIR; container sandboxes set the
Harbor paths (LOGS_DIR=/logs). A test.sh written as `${LOGS_DIR:-/logs}` works in both.

An image source (tasks baked into an OCI image) is mounted into the runner's pod by the operator and read
there as a directory.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any, Literal

from harnessrl.runtime.contracts.runner_config import DirTasks, HubTasks, TaskSource
from pydantic import BaseModel, ConfigDict, Field, ValidationError

# validation: held out from training like test, but read to pick the best checkpoint, so test stays unbiased.
Split = Literal["train", "validation", "test"]
SPLITS: tuple[Split, ...] = ("train", "validation", "test")


class TaskError(ValueError):
    """A task directory that does not follow the format."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow")


class AgentSection(_Section):
    timeout_sec: float | None = Field(None, gt=0)


class VerifierSection(_Section):
    timeout_sec: float | None = Field(None, gt=0)
    env: dict[str, str] = Field(default_factory=dict)


class EnvironmentSection(_Section):
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    allow_internet: bool = False


class TaskToml(BaseModel):
    model_config = ConfigDict(extra="allow")

    version: str = "1.0"
    metadata: dict[str, Any] = Field(default_factory=dict)
    agent: AgentSection = AgentSection()
    verifier: VerifierSection = VerifierSection()
    environment: EnvironmentSection = EnvironmentSection()


class Task(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    path: Path
    instruction: str
    split: Split
    config: TaskToml

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    @property
    def has_reference(self) -> bool:
        """Whether the task ships Harbor's reference answer (solution/solve.sh)."""
        return (self.solution_dir / "solve.sh").is_file()


def load_task(path: Path, task_id: str | None = None) -> Task:
    """Read one task directory; errors name the task and the file at fault."""
    path = Path(path)
    name = task_id or path.name
    toml_path, instruction_path, test_sh = path / "task.toml", path / "instruction.md", path / "tests" / "test.sh"
    for required in (toml_path, instruction_path, test_sh):
        if not required.is_file():
            raise TaskError(f"task {name!r}: missing {required.relative_to(path)}")
    try:
        config = TaskToml.model_validate(tomllib.loads(toml_path.read_text()))
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        raise TaskError(f"task {name!r}: bad task.toml: {exc}") from exc
    instruction = instruction_path.read_text().strip()
    if not instruction:
        raise TaskError(f"task {name!r}: instruction.md is empty")
    split = config.metadata.get("split") or (path.parent.name if path.parent.name in SPLITS else "train")
    if split not in SPLITS:
        raise TaskError(f"task {name!r}: metadata.split must be one of {', '.join(SPLITS)}, not {split!r}")
    return Task(id=name, path=path.resolve(), instruction=instruction, split=split, config=config)


def load_dir(root: Path) -> dict[str, Task]:
    """Every task under `root` (any depth), by id = its directory name; ids must be unique."""
    root = Path(root)
    if not root.is_dir():
        raise TaskError(f"task directory {root} does not exist")
    tasks: dict[str, Task] = {}
    for toml_path in sorted(root.rglob("task.toml")):
        task = load_task(toml_path.parent)
        if task.id in tasks:
            raise TaskError(f"duplicate task id {task.id!r}: {tasks[task.id].path} and {task.path}")
        tasks[task.id] = task
    if not tasks:
        raise TaskError(f"no tasks (no task.toml) under {root}")
    return tasks


def fetch_hub(source: HubTasks) -> Path:
    """Snapshot a Hub dataset (huggingface_hub honours HF_ENDPOINT, so tests point it at a local server)."""
    from huggingface_hub import snapshot_download

    token = source.token_file.read_text().strip() if source.token_file else None
    local = snapshot_download(
        repo_id=source.repo_id,
        repo_type=source.repo_type,
        revision=source.revision,
        token=token,
        cache_dir=str(source.cache_dir) if source.cache_dir else None,
    )
    return Path(local) / source.subdir


def source_dir(source: TaskSource) -> Path:
    """The local directory holding a source's tasks (a Hub dataset is downloaded first)."""
    if isinstance(source, DirTasks):
        return source.path
    if isinstance(source, HubTasks):
        return fetch_hub(source)
    # An image source is mounted into the runner's pod at its path by the operator (an image volume).
    return Path(source.path)


def split_tasks(tasks: dict[str, Task], split: Split) -> dict[str, Task]:
    return {tid: t for tid, t in tasks.items() if t.split == split}


class Grade(BaseModel):
    """What the verifier wrote. `reward` is the correctness in [0, 1]."""

    reward: float = Field(ge=0.0, le=1.0)
    details: dict[str, float] = Field(default_factory=dict)


def parse_reward(reward_txt: str | None, reward_json: str | None) -> Grade:
    """Read what the verifier wrote (reward.txt wins, as in Harbor); raise TaskError if neither is usable."""
    if reward_txt is not None:
        raw = reward_txt.strip()
        try:
            value = float(raw)
        except ValueError as exc:
            raise TaskError(f"reward.txt is not a number: {raw[:80]!r}") from exc
        return _grade(value, {})
    if reward_json is not None:
        try:
            data = json.loads(reward_json)
        except json.JSONDecodeError as exc:
            raise TaskError(f"reward.json is not JSON: {exc}") from exc
        if isinstance(data, int | float) and not isinstance(data, bool):
            return _grade(float(data), {})
        if not isinstance(data, dict) or not data or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in data.values()
        ):
            raise TaskError("reward.json must be a number or a non-empty object of numbers")
        details = {str(k): float(v) for k, v in data.items()}
        # Harbor's convention: the "reward" key; otherwise the metrics are averaged.
        value = details["reward"] if "reward" in details else sum(details.values()) / len(details)
        return _grade(value, details)
    raise TaskError("the verifier wrote neither reward.txt nor reward.json")


def _grade(value: float, details: dict[str, float]) -> Grade:
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise TaskError(f"reward {value} is outside [0, 1]")
    return Grade(reward=value, details=details)
