"""The sandbox interface: where one rollout's harness and grader run.

A `SandboxProvider` (one per runner) opens a `Sandbox` per rollout. The sandbox holds the task's workspace
(environment/ copied in), a fresh HOME, and Harbor's paths for the verifier; `run` executes a command there with a
wall-clock limit and kills everything it started when that limit passes or the caller is cancelled; `close`
tears it all down. Providers reap what a crashed runner left behind on `start`, and everything still open on
`shutdown`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType

from harnessrl.runtime.harness.tasks import Grade, Task, TaskError, parse_reward
from pydantic import BaseModel, Field


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not be created, lost, API errors): an infrastructure error."""


class ExecResult(BaseModel):
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    duration_s: float = Field(default=0.0, ge=0)
    # Set when the sandbox stopped the command for going over one of its limits (which, in the sandbox's words).
    limit_exceeded: str | None = None


class GradeResult(BaseModel):
    """The verifier's run: the grade, or why there is none (a grader error)."""

    grade: Grade | None
    output: str
    error: str | None = None
    timed_out: bool = False


# Keep at most this much of a command's output (its tail) in memory.
OUTPUT_LIMIT = 256 * 1024


def verifier_env(task: Task, sandbox: Sandbox) -> dict[str, str]:
    """What test.sh is told: Harbor's paths as this sandbox has them, and the task's own verifier env."""
    return {
        **task.config.verifier.env,
        "WORKSPACE": sandbox.workspace,
        "TESTS_DIR": sandbox.tests_dir,
        "LOGS_DIR": sandbox.logs_dir,
    }


def graded(res: ExecResult, timeout_s: float, reward_txt: str | None, reward_json: str | None) -> GradeResult:
    """The grade from the verifier's run and what it wrote; a missing or unusable reward is no grade (the exit
    status alone never means success)."""
    output = (res.stdout + res.stderr)[-65536:]
    if res.timed_out:
        return GradeResult(grade=None, output=output, error=f"verifier timed out after {timeout_s:.0f}s", timed_out=True)
    if res.limit_exceeded:
        return GradeResult(grade=None, output=output, error=f"verifier stopped: {res.limit_exceeded}")
    try:
        grade = parse_reward(reward_txt, reward_json)
    except TaskError as exc:
        return GradeResult(grade=None, output=output, error=f"{exc} (test.sh exit code {res.exit_code})")
    return GradeResult(grade=grade, output=output)


class Sandbox(ABC):
    """One rollout's sandbox. Paths are as seen from inside it."""

    home: str
    workspace: str
    tests_dir: str
    logs_dir: str

    def proxy_url(self, url: str) -> str:
        """The proxy URL as reachable from inside this sandbox (remote sandboxes rewrite it)."""
        return url

    @abstractmethod
    async def write_files(self, files: dict[str, str]) -> None:
        """Write text files (absolute paths inside the sandbox), creating parents; mode 0600."""

    @abstractmethod
    async def read_file(self, path: str) -> str | None:
        """A text file's content, or None if it does not exist."""

    @abstractmethod
    async def run(
        self, argv: list[str], env: dict[str, str], timeout_s: float, cwd: str | None = None
    ) -> ExecResult:
        """Run argv (cwd = the workspace) and wait at most timeout_s; on timeout or cancellation everything
        it started is killed before this returns or raises."""

    @abstractmethod
    async def close(self) -> None:
        """Kill anything left and delete the sandbox. Idempotent."""

    @abstractmethod
    async def grade(self, task: Task, timeout_s: float) -> GradeResult:
        """Run tests/test.sh as Harbor does and read the reward it wrote. Called only once every process the
        harness started is gone."""

    async def run_reference(self, task: Task, timeout_s: float) -> ExecResult:
        """Run the task's reference answer (Harbor's oracle, solution/solve.sh) in this fresh sandbox."""
        where = f"{self.home}/.reference"
        files = {f"{where}/{path.relative_to(task.solution_dir)}": path.read_text()
                 for path in sorted(task.solution_dir.rglob("*")) if path.is_file()}
        await self.write_files(files)
        env = {"WORKSPACE": self.workspace, "SOLUTION_DIR": where}
        return await self.run(["bash", f"{where}/solve.sh"], env, timeout_s)

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class InPlaceGradingSandbox(Sandbox):
    """A sandbox whose verifier runs where the harness ran, once its processes are killed: the tests, and an
    emptied reward directory, are put in first (the remote kinds; the local one grades in a sandbox of its own)."""

    @abstractmethod
    async def put_tests(self, task: Task) -> None:
        """Copy the task's tests/ in (only after the harness is done, as Harbor does)."""

    async def grade(self, task: Task, timeout_s: float) -> GradeResult:
        await self.put_tests(task)
        res = await self.run(["bash", f"{self.tests_dir}/test.sh"], verifier_env(task, self), timeout_s)
        if res.timed_out:
            return graded(res, timeout_s, None, None)
        txt = await self.read_file(f"{self.logs_dir}/verifier/reward.txt")
        js = await self.read_file(f"{self.logs_dir}/verifier/reward.json")
        return graded(res, timeout_s, txt, js)


class SandboxProvider(ABC):
    """Makes sandboxes for one runner."""

    @abstractmethod
    async def start(self) -> None:
        """Reap sandboxes an earlier runner of this pool left behind."""

    @abstractmethod
    async def open(self, rollout_id: str, task: Task) -> Sandbox:
        """A fresh sandbox with the task's environment/ in its workspace. Raises SandboxError."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Close every sandbox still open."""
