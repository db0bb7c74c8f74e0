"""Sandboxes that run commands through a remote shell (kubernetes exec, E2B): the shell lines they send (pure)
and `RemoteShellSandbox`, the file and process handling both build on one `sh -c` primitive."""

from __future__ import annotations

import asyncio
import base64
import io
import shlex
import tarfile
import time
from abc import abstractmethod
from pathlib import Path

from harnessrl.runtime.harness.sandboxes.base import ExecResult, InPlaceGradingSandbox, SandboxError
from harnessrl.runtime.harness.tasks import Task

# Remote argv limits are about 128 KiB per argument on Linux; task files travel as base64 in one argument.
MAX_INLINE_BYTES = 96 * 1024

# Exit status of `timeout --signal=KILL` when it had to kill the command.
TIMEOUT_KILLED = 137

# Run after every command: SIGKILL to every process of the sandbox's user but this shell (and PID 1). One call
# reaches them all at once, in the kernel: unlike pkill's pass over /proc, nothing that forks anew meanwhile slips
# through.
KILL_ALL = "kill -9 -1 2>/dev/null; true"


def shell_line(argv: list[str], env: dict[str, str], cwd: str, timeout_s: float | None = None) -> str:
    """One `sh -c` line: cd, set env, run argv (under coreutils `timeout` when given); every word quoted."""
    words = ["env", *(f"{k}={v}" for k, v in sorted(env.items())), *argv]
    if timeout_s is not None:
        words = ["timeout", "--signal=KILL", f"{max(1, int(timeout_s))}", *words]
    return f"cd {shlex.quote(cwd)} && exec " + " ".join(shlex.quote(w) for w in words)


def write_file_line(path: str, content: str) -> str:
    data = content.encode()
    if len(data) > MAX_INLINE_BYTES:
        raise ValueError(f"{path}: {len(data)} bytes is over the {MAX_INLINE_BYTES}-byte inline limit")
    b64 = base64.b64encode(data).decode()
    q = shlex.quote(path)
    return f"mkdir -p \"$(dirname {q})\" && printf %s {b64} | base64 -d > {q} && chmod 600 {q}"


def tar_b64(directory: Path, skip: frozenset[str] = frozenset({".keep"})) -> str:
    """A directory's files as a base64 gzip tarball (for small task directories)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(directory.rglob("*")):
            if path.name not in skip:
                tar.add(path, arcname=str(path.relative_to(directory)), recursive=False)
    data = buf.getvalue()
    if len(data) > MAX_INLINE_BYTES:
        raise ValueError(f"{directory}: {len(data)} compressed bytes is over the inline limit")
    return base64.b64encode(data).decode()


def untar_line(b64: str, dest: str) -> str:
    q = shlex.quote(dest)
    return f"mkdir -p {q} && printf %s {b64} | base64 -d | tar -xz -C {q}"


def pack_line(directory: str) -> str:
    """Packs a directory into a fresh temporary gzip tarball; prints the tarball's path and size."""
    return f't=$(mktemp) && tar -C {shlex.quote(directory)} -czf "$t" . && echo "$t" $(wc -c < "$t")'


def read_chunk_line(path: str, offset: int, size: int) -> str:
    """Prints `size` bytes of a file from `offset`, base64-encoded."""
    return f"tail -c +{offset + 1} {shlex.quote(path)} | head -c {size} | base64 -w0"


def unpack_line(size: int, dest: str) -> str:
    """Unpacks the gzip tarball of `size` bytes that arrives on stdin (no end of input needed)."""
    q = shlex.quote(dest)
    return f"mkdir -p {q} && head -c {size} | tar -xz -C {q}"


def read_file_line(path: str) -> str:
    """Prints the file base64-encoded (exact bytes through a text channel); exit 3 if it does not exist."""
    q = shlex.quote(path)
    return f"test -f {q} || exit 3; base64 {q}"


class RemoteShellSandbox(InPlaceGradingSandbox):
    """A sandbox driven by `sh -c LINE` alone; subclasses say how a line runs. After every command KILL_ALL ends
    whatever it left behind (daemons, backgrounded tools)."""

    @abstractmethod
    async def _sh(self, line: str, timeout_s: float) -> ExecResult:
        """Run one shell line; a non-zero exit is a result. Raises SandboxError when the sandbox is unreachable."""

    @property
    def where(self) -> str:
        """Names the sandbox in error messages (" in pod X"), or nothing."""
        return ""

    async def _check(self, line: str, timeout_s: float, failed: str) -> ExecResult:
        res = await self._sh(line, timeout_s)
        if res.exit_code != 0:
            raise SandboxError(f"{failed}{self.where} failed: {res.stderr[-300:]}")
        return res

    async def write_files(self, files: dict[str, str]) -> None:
        for path, content in files.items():
            await self._check(write_file_line(path, content), 60, f"writing {path}")

    async def read_file(self, path: str) -> str | None:
        res = await self._sh(read_file_line(path), 60)
        if res.exit_code == 3:
            return None
        if res.exit_code != 0:
            raise SandboxError(f"reading {path}{self.where} failed: {res.stderr[-300:]}")
        return base64.b64decode(res.stdout).decode(errors="replace")

    async def put_dir(self, b64: str, dest: str) -> None:
        await self._check(untar_line(b64, dest), 120, f"copying files into {dest}")

    async def put_tests(self, task: Task) -> None:
        # Whatever the harness left where the verifier reads and writes goes first: a planted (or unwritable)
        # reward is never graded. The directories may be mount points (a Pod's emptyDirs): emptied, not removed.
        dirs = " ".join(shlex.quote(d) for d in (self.tests_dir, self.logs_dir))
        line = (f'for d in {dirs}; do mkdir -p "$d" && find "$d" -mindepth 1 -delete || exit 1; done && '
                f"mkdir -p {shlex.quote(self.logs_dir)}/verifier")
        await self._check(line, 60, "clearing the verifier's directories")
        await self.put_dir(tar_b64(task.tests_dir), self.tests_dir)

    async def run(self, argv: list[str], env: dict[str, str], timeout_s: float, cwd: str | None = None) -> ExecResult:
        line = shell_line(argv, {"HOME": self.home, **env}, cwd or self.workspace, timeout_s)
        started = time.monotonic()
        try:
            res = await self._sh(line, timeout_s + 30)
            res.duration_s = time.monotonic() - started
        finally:
            await asyncio.shield(self._sh(KILL_ALL, 30))
        res.timed_out = res.timed_out or (res.exit_code == TIMEOUT_KILLED and res.duration_s >= timeout_s)
        return res
