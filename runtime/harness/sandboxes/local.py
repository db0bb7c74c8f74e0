"""The local sandbox: a directory per rollout and the harness as a limited subprocess on this machine.

Each rollout gets `base_dir/<prefix>-<rollout>-<random>/` (mode 0700) holding `home/`, `workspace/`,
`tests/` and `logs/`. Commands run:
- in their own session and process group, with RLIMIT_CPU / RLIMIT_DATA / RLIMIT_NPROC set before exec;
- tagged with HARNESSRL_SANDBOX=<dir name> in their environment; on timeout, cancellation or close the group is
  SIGKILLed and then every process still carrying the tag (a daemon that left the group) is too, so nothing a
  harness starts outlives its rollout;
- when the runner is root (isolation "auto" or "namespace"), in a private mount namespace where `base_dir` is an
  empty tmpfs except for the rollout's own directory, and the task source and the proxy admin token are hidden:
  a rollout cannot see another's workspace or the graders' expected answers. Without root this isolation is
  off ("auto") and only the directory modes separate rollouts (which do not stop a same-uid process).

Network: not restricted here. Limiting a local process to the proxy needs a network namespace plus a forwarder
or firewall rules on the host, which this sandbox does not change; the kubernetes sandbox enforces it with a
NetworkPolicy.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import re
import resource
import secrets
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

from harnessrl.runtime.harness.config import LocalSandboxConfig
from harnessrl.runtime.harness.sandboxes.base import (
    OUTPUT_LIMIT,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxProvider,
)
from harnessrl.runtime.harness.tasks import Task

log = logging.getLogger(__name__)

MARKER_ENV = "HARNESSRL_SANDBOX"
CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000


def _libc_call(name: str, *args: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    _libc_call("mount", enc(source), target.encode(), enc(fstype), ctypes.c_ulong(flags), enc(data))


def isolate_mounts(base_dir: Path, own_dir: Path, hide: list[Path]) -> None:
    """In the calling (child) process: a private mount namespace where base_dir shows only own_dir and
    each path in `hide` is masked (a directory by an empty tmpfs, a file by /dev/null). Needs root."""
    _libc_call("unshare", CLONE_NEWNS)
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    own_fd = os.open(own_dir, os.O_PATH | os.O_DIRECTORY)
    for path in hide:
        if path.is_dir():
            _mount("tmpfs", str(path), "tmpfs", 0, "mode=000,size=4k")
        elif path.exists():
            _mount("/dev/null", str(path), None, MS_BIND, None)
    _mount("tmpfs", str(base_dir), "tmpfs", 0, "mode=0711,size=64k")
    os.makedirs(own_dir, mode=0o700, exist_ok=True)
    _mount(f"/proc/self/fd/{own_fd}", str(own_dir), None, MS_BIND | MS_REC, None)
    os.close(own_fd)


def child_setup(
    limits: list[tuple[int, int, int]], isolation: Callable[[], None] | None, cwd: str
) -> Callable[[], None]:
    """The preexec function: rlimits, then the mount isolation, then back into the workspace."""

    def setup() -> None:
        for which, soft, hard in limits:
            resource.setrlimit(which, (soft, hard))
        if isolation is not None:
            isolation()
        os.chdir(cwd)

    return setup


def rlimits(config: LocalSandboxConfig) -> list[tuple[int, int, int]]:
    """(resource, soft, hard). CPU: SIGXCPU at the soft limit, SIGKILL 5 s later. Memory: RLIMIT_DATA, not
    RLIMIT_AS — Node reserves gigabytes of address space for WebAssembly and fails under an AS limit."""
    out = [(resource.RLIMIT_CPU, config.cpu_seconds, config.cpu_seconds + 5)]
    if config.memory_mb is not None:
        out.append((resource.RLIMIT_DATA, config.memory_mb * 1024 * 1024, config.memory_mb * 1024 * 1024))
    if config.max_processes is not None:
        out.append((resource.RLIMIT_NPROC, config.max_processes, config.max_processes))
    return out


def tagged_pids(marker: str) -> list[int]:
    """Processes whose environment carries HARNESSRL_SANDBOX=marker (exact) or, for a prefix ending in '-',
    any tag starting with it."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        for var in environ.split(b"\0"):
            if var == needle or (marker.endswith("-") and var.startswith(needle)):
                found.append(int(entry.name))
                break
    return found


def kill_tagged(marker: str) -> int:
    """SIGKILL every process tagged with marker (repeat until none: a dying parent may fork once more). Done only
    after two empty scans in a row: a process in the middle of execve can show an empty environ for an instant."""
    killed = 0
    empty_scans = 0
    for _ in range(20):
        pids = tagged_pids(marker)
        empty_scans = 0 if pids else empty_scans + 1
        if empty_scans == 2:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.05)
    return killed


def _read_tail(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - OUTPUT_LIMIT))
            return fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


class LocalSandbox(Sandbox):
    def __init__(self, provider: LocalProvider, root: Path) -> None:
        self.provider = provider
        self.root = root
        self.name = root.name
        self.home = str(root / "home")
        self.workspace = str(root / "workspace")
        self.tests_dir = str(root / "tests")
        self.logs_dir = str(root / "logs")
        self._runs = 0
        self._closed = False

    def _inside(self, path: str) -> Path:
        resolved = Path(os.path.normpath(path))
        if not resolved.is_relative_to(self.root):
            raise SandboxError(f"path {path} is outside the sandbox {self.root}")
        return resolved

    async def write_files(self, files: dict[str, str]) -> None:
        for path, content in files.items():
            target = self._inside(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            target.chmod(0o600)

    async def read_file(self, path: str) -> str | None:
        target = self._inside(path)
        try:
            return target.read_text(errors="replace")
        except (FileNotFoundError, IsADirectoryError):
            return None

    async def put_tests(self, task: Task) -> None:
        shutil.copytree(task.tests_dir, self.tests_dir, dirs_exist_ok=True)

    async def run(
        self, argv: list[str], env: dict[str, str], timeout_s: float, cwd: str | None = None
    ) -> ExecResult:
        if self._closed:
            raise SandboxError(f"sandbox {self.name} is closed")
        self._runs += 1
        io_dir = self.root / "io"
        io_dir.mkdir(exist_ok=True)
        out_path, err_path = io_dir / f"{self._runs}.out", io_dir / f"{self._runs}.err"
        full_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            **env,
            "HOME": self.home,
            "PWD": cwd or self.workspace,  # some CLIs take their project directory from $PWD, not getcwd()
            "TMPDIR": str(self.root / "tmp"),
            MARKER_ENV: self.name,
        }
        (self.root / "tmp").mkdir(exist_ok=True)
        workdir = cwd or self.workspace
        started = time.monotonic()
        with out_path.open("wb") as out, err_path.open("wb") as err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=full_env,
                    cwd=workdir,
                    start_new_session=True,  # its own session and process group: killed as one
                    preexec_fn=child_setup(self.provider.limits, self.provider.isolation_for(self.root), workdir),
                )
            except (OSError, ValueError) as exc:
                raise SandboxError(f"cannot start {argv[0]!r}: {exc}") from exc
            timed_out = False
            try:
                await asyncio.wait_for(proc.wait(), timeout_s)
            except TimeoutError:
                timed_out = True
            finally:
                # Normal exit, timeout or cancellation: nothing it started may keep running.
                self._kill(proc.pid)
                if proc.returncode is None:
                    await asyncio.shield(proc.wait())
        return ExecResult(
            exit_code=proc.returncode if proc.returncode is not None else -9,
            stdout=_read_tail(out_path),
            stderr=_read_tail(err_path),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    def _kill(self, pgid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        kill_tagged(self.name)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(kill_tagged, self.name)
        if not self.provider.config.keep:
            await asyncio.to_thread(shutil.rmtree, self.root, True)
        self.provider.forget(self)


class LocalProvider(SandboxProvider):
    """Local sandboxes under config.base_dir. `prefix` names this runner's sandboxes (for reaping)."""

    def __init__(
        self,
        config: LocalSandboxConfig,
        prefix: str = "rollout",
        hide: list[Path] | None = None,
        isolation: str = "auto",
    ) -> None:
        if isolation not in ("auto", "namespace", "none"):
            raise ValueError(f"isolation must be auto, namespace or none, not {isolation!r}")
        self.config = config
        self.base_dir = config.base_dir.resolve()
        self.prefix = re.sub(r"[^A-Za-z0-9_.-]", "-", prefix)
        self.hide = [p.resolve() for p in hide or []]
        self.limits = rlimits(config)
        self.namespaces = isolation == "namespace" or (isolation == "auto" and os.geteuid() == 0)
        self.open_sandboxes: dict[str, LocalSandbox] = {}

    def isolation_for(self, root: Path) -> Callable[[], None] | None:
        if not self.namespaces:
            return None
        return lambda: isolate_mounts(self.base_dir, root, self.hide)

    async def start(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.base_dir.chmod(0o711)
        # Whatever an earlier runner with this prefix left: its processes, then its directories.
        killed = await asyncio.to_thread(kill_tagged, f"{self.prefix}-")
        stale = [d for d in self.base_dir.iterdir() if d.is_dir() and d.name.startswith(f"{self.prefix}-")]
        for d in stale:
            await asyncio.to_thread(shutil.rmtree, d, True)
        if killed or stale:
            log.info("reaped %d processes and %d sandboxes left by an earlier runner", killed, len(stale))

    async def open(self, rollout_id: str, task: Task) -> LocalSandbox:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "-", rollout_id)[:64]
        root = self.base_dir / f"{self.prefix}-{safe}-{secrets.token_hex(4)}"
        try:
            root.mkdir(mode=0o700, parents=False)
            for sub in ("home", "workspace", "tests", "logs/verifier"):
                (root / sub).mkdir(mode=0o700, parents=True)
            if task.environment_dir.is_dir():
                shutil.copytree(
                    task.environment_dir, root / "workspace", dirs_exist_ok=True, ignore=shutil.ignore_patterns(".keep")
                )
        except OSError as exc:
            shutil.rmtree(root, ignore_errors=True)
            raise SandboxError(f"cannot create a sandbox under {self.base_dir}: {exc}") from exc
        sandbox = LocalSandbox(self, root)
        self.open_sandboxes[sandbox.name] = sandbox
        return sandbox

    def forget(self, sandbox: LocalSandbox) -> None:
        self.open_sandboxes.pop(sandbox.name, None)

    async def shutdown(self) -> None:
        for sandbox in list(self.open_sandboxes.values()):
            await sandbox.close()
