"""The local sandbox: a directory per rollout and the harness in bubblewrap namespaces on this machine.

Each rollout gets `base_dir/<prefix>-<rollout>-<random>/` (mode 0700) holding `home/`, `workspace/` and `tmp/`,
all of which the harness may rewrite: the runner keeps nothing of its own there (output comes through pipes) and
reads a file there only through `read_beneath` (no link followed, no FIFO or device opened, bounded). The grader
runs once the harness's processes are gone, in a sandbox of its own (`grade`). Commands run:
- under bubblewrap (bwrap.py): their own mount namespace (read-only system and tool directories, read-write only
  the rollout's own directory: no other rollout, no task source, no token file), PID namespace (no other process
  to see or signal; all of it dies with the command), and network namespace whose only way out is a relay to the
  session's proxy (netrelay.py; `proxy_url` names the address inside);
- as an unprivileged uid (`run_as_uid`) when the runner is root, which also makes RLIMIT_NPROC bind;
- in their own session and process group, with RLIMIT_CPU / RLIMIT_DATA / RLIMIT_FSIZE / RLIMIT_NPROC set before
  exec, tagged with HARNESSRL_SANDBOX=<dir name>; on timeout, cancellation or close the group is SIGKILLed and
  then every process still carrying the tag is too.
Where bubblewrap cannot run, `start` refuses unless the pool allows unisolated sandboxes (`allow_unisolated`);
those run the command as a plain limited subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import resource
import secrets
import shlex
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from harnessrl.runtime.contracts.runner_config import LocalSandboxConfig
from harnessrl.runtime.harness.sandboxes import bwrap, netrelay
from harnessrl.runtime.harness.sandboxes.base import (
    OUTPUT_LIMIT,
    ExecResult,
    GradeResult,
    Sandbox,
    SandboxError,
    SandboxProvider,
    graded,
)
from harnessrl.runtime.harness.tasks import Task

log = logging.getLogger(__name__)

MARKER_ENV = "HARNESSRL_SANDBOX"
# The grader's interpreter: an absolute path to a real Python (no shim that a workspace's .python-version steers).
GRADER_PYTHON = str(Path(sys.base_prefix) / "bin" / "python3")


def child_setup(limits: list[tuple[int, int, int]]) -> Callable[[], None]:
    """The preexec function: the rlimits (inherited through bwrap by the harness)."""

    def setup() -> None:
        for which, soft, hard in limits:
            resource.setrlimit(which, (soft, hard))

    return setup


def inside_url(url: str) -> tuple[str, tuple[str, int]]:
    """A proxy URL as the sandbox reaches it (loopback, same port) and the host:port it is relayed to."""
    parts = urlsplit(url)
    if parts.hostname is None:
        raise SandboxError(f"proxy URL {url!r} names no host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return urlunsplit((parts.scheme, f"127.0.0.1:{port}", parts.path, parts.query, parts.fragment)), (parts.hostname, port)


def rlimits(config: LocalSandboxConfig, memory_mb: int | None = None) -> list[tuple[int, int, int]]:
    """(resource, soft, hard). CPU: SIGXCPU at the soft limit, SIGKILL 5 s later. Memory (`memory_mb`, else the
    config's): RLIMIT_DATA, not RLIMIT_AS — Node reserves gigabytes of address space for WebAssembly and fails
    under an AS limit."""
    out = [(resource.RLIMIT_CPU, config.cpu_seconds, config.cpu_seconds + 5)]
    memory_mb = memory_mb or config.memory_mb
    if memory_mb is not None:
        out.append((resource.RLIMIT_DATA, memory_mb * 1024 * 1024, memory_mb * 1024 * 1024))
    if config.max_processes is not None:
        out.append((resource.RLIMIT_NPROC, config.max_processes, config.max_processes))
    if config.max_file_mb is not None:
        out.append((resource.RLIMIT_FSIZE, config.max_file_mb * 1024 * 1024, config.max_file_mb * 1024 * 1024))
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


async def _exited(proc: asyncio.subprocess.Process, timeout_s: float) -> bool:
    """Whether the process has exited within timeout_s. Not proc.wait(): that returns only once every pipe of
    the process is closed too, which a process still holding its output can put off for as long as it lives."""
    deadline = time.monotonic() + timeout_s
    while proc.returncode is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(EXIT_POLL_S)
    return True


async def _tail(stream: asyncio.StreamReader | None, buf: bytearray) -> None:
    """Read a pipe until EOF into buf, keeping only its last OUTPUT_LIMIT bytes (buf holds what was read if the
    reading is cancelled)."""
    while stream is not None and (chunk := await stream.read(65536)):
        buf += chunk
        del buf[:-OUTPUT_LIMIT]


# How often a running command's disk use is measured against `max_disk_mb`.
DISK_CHECK_S = 2.0
EXIT_POLL_S = 0.05  # how often a command is checked for its exit (the wait is per command, not per token)
KILL_WAIT_S = 10.0  # a SIGKILLed command is gone at once; past this its exit code is unknown (-9)


def disk_usage(root: Path) -> int:
    """Bytes of disk the files under `root` take (allocated blocks, so sparse files count what they hold), links
    not followed."""
    total, stack = 0, [root]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    with contextlib.suppress(OSError):
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
        except OSError:
            continue
    return total


# The largest file the runner reads out of a sandbox (a harness's trajectory, a reward); a larger one is refused.
READ_LIMIT = 64 * 1024 * 1024


def read_beneath(root: Path, path: Path, limit: int = READ_LIMIT) -> bytes | None:
    """A regular file's bytes at `path` under `root`, opened component by component without following a link,
    or None where something else stands there (a link, a FIFO, a device, a directory), nothing does, or it is
    larger than `limit`. The runner reads what a harness could have planted only this way: nothing there can
    make it block, follow a link out of the sandbox, or read without end."""
    parts = path.relative_to(root).parts
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    fd = os.open(root, flags | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                nfd = os.open(part, flags | (0 if last else os.O_DIRECTORY), dir_fd=fd)
            except OSError:  # missing, a link (ELOOP), not a directory, a FIFO without a writer (ENXIO)
                return None
            os.close(fd)
            fd = nfd
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        data = os.read(fd, limit + 1)
        return data if len(data) <= limit else None
    finally:
        os.close(fd)


class LocalSandbox(Sandbox):
    def __init__(self, provider: LocalProvider, root: Path) -> None:
        self.provider = provider
        self.root = root
        self.name = root.name
        self.home = str(root / "home")
        self.workspace = str(root / "workspace")
        self.tests_dir = str(root / "tests")
        self.logs_dir = str(root / "logs")
        self._closed = False
        # Inside port -> (host, port) of the proxy it is relayed to, and the relays' runner-side halves.
        self.forwards: dict[int, tuple[str, int]] = {}
        self.forwarders: dict[int, netrelay.UnixForwarder] = {}
        self.relay_dir: Path | None = None

    def proxy_url(self, url: str) -> str:
        if not self.provider.isolates_network:
            return url
        inside, target = inside_url(url)
        port = target[1]
        if self.forwards.setdefault(port, target) != target:
            raise SandboxError(f"sandbox {self.name}: port {port} already relays to {self.forwards[port]}")
        return inside

    def _inside(self, path: str) -> Path:
        resolved = Path(os.path.normpath(path))
        if not resolved.is_relative_to(self.root):
            raise SandboxError(f"path {path} is outside the sandbox {self.root}")
        return resolved

    def _own(self, path: Path) -> None:
        """Hand what the runner wrote to the harness's uid (a root runner drops to another)."""
        uid = self.provider.drop_to
        if uid is None:
            return
        for parent in [path, *path.parents]:
            if not parent.is_relative_to(self.root):
                break
            os.chown(parent, uid, uid)
        if path.is_dir():
            for sub in path.rglob("*"):
                os.chown(sub, uid, uid, follow_symlinks=False)

    async def write_files(self, files: dict[str, str]) -> None:
        for path, content in files.items():
            target = self._inside(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            target.chmod(0o600)
            self._own(target)

    async def read_file(self, path: str) -> str | None:
        data = read_beneath(self.root, self._inside(path))
        return None if data is None else data.decode(errors="replace")

    async def grade(self, task: Task, timeout_s: float) -> GradeResult:
        """test.sh in a fresh sandbox of its own: a new bubblewrap whose only mount of the rollout is the
        workspace, with its own HOME and TMPDIR, its tests copied in fresh and read-only, its reward directory
        empty and out of the harness's reach, and `$RUN_CANDIDATE` to run the candidate's code without them."""
        try:
            st = os.lstat(self.workspace)
        except OSError:
            st = None
        if st is None or not stat.S_ISDIR(st.st_mode):
            return GradeResult(grade=None, output="", error="the workspace is gone or no longer a directory")
        grader = self.provider.base_dir / f"{self.name}.grader"
        try:
            await asyncio.to_thread(self.provider.make_grader_dir, grader, task)
            env = {
                **task.config.verifier.env,
                "PATH": f"{Path(GRADER_PYTHON).parent}:/usr/local/bin:/usr/bin:/bin",
                "PYTHON": GRADER_PYTHON,
                "WORKSPACE": self.workspace,
                "TESTS_DIR": str(grader / "tests"),
                "LOGS_DIR": str(grader / "logs"),
                "HOME": str(grader / "home"),
                "TMPDIR": str(grader / "tmp"),
                "RUN_CANDIDATE": str(grader / "bin" / "run-candidate"),
            }
            command = ["bash", str(grader / "tests" / "test.sh")]
            if self.provider.isolated:
                plan = self.provider.grader_plan(grader, Path(self.workspace))
                command = bwrap.bwrap_argv(plan, command, self.workspace)
            memory_mb = task.config.environment.memory_mb or self.provider.config.memory_mb
            limits = rlimits(self.provider.config, memory_mb)
            res = await self._exec(command, env, timeout_s, self.workspace, limits, Path(self.workspace))
            txt = read_beneath(grader, grader / "logs" / "verifier" / "reward.txt")
            js = read_beneath(grader, grader / "logs" / "verifier" / "reward.json")
        finally:
            await asyncio.to_thread(shutil.rmtree, grader, True)
        return graded(res, timeout_s, *(None if b is None else b.decode(errors="replace") for b in (txt, js)))

    async def _start_forwarders(self) -> list[str]:
        """The `PORT=SOCKET` arguments of netrelay's inside half, its outside halves listening."""
        if self.relay_dir is None:
            self.relay_dir = Path(tempfile.mkdtemp(prefix="hrl-relay-"))
            self.relay_dir.chmod(0o711)
        specs = []
        for port, (host, target_port) in self.forwards.items():
            if port not in self.forwarders:
                forwarder = netrelay.UnixForwarder(self.relay_dir / f"{port}.sock", host, target_port)
                try:
                    await forwarder.start()
                except OSError as exc:
                    raise SandboxError(f"cannot relay the proxy into sandbox {self.name}: {exc}") from exc
                self.forwarders[port] = forwarder
            specs.append(f"{port}={bwrap.RELAY_DIR}/{port}.sock")
        return specs

    async def command(self, argv: list[str], workdir: str) -> list[str]:
        plan = self.provider.plan_for(self.root)
        if plan is None:
            return argv
        if self.forwards:
            relay = [sys.executable, "-I", "-S", netrelay.__file__, *await self._start_forwarders(), "--"]
            argv = [*relay, *argv]
            plan = plan.model_copy(update={"binds": ((self.relay_dir, bwrap.RELAY_DIR),)})
        return bwrap.bwrap_argv(plan, argv, workdir)

    async def run(
        self, argv: list[str], env: dict[str, str], timeout_s: float, cwd: str | None = None
    ) -> ExecResult:
        if self._closed:
            raise SandboxError(f"sandbox {self.name} is closed")
        workdir = cwd or self.workspace
        full_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            **env,
            "HOME": self.home,
            "PWD": workdir,  # some CLIs take their project directory from $PWD, not getcwd()
            "TMPDIR": str(self.root / "tmp"),
        }
        command = await self.command(argv, workdir)
        return await self._exec(command, full_env, timeout_s, workdir, self.provider.limits, self.root)

    async def _exec(
        self, command: list[str], env: dict[str, str], timeout_s: float, workdir: str,
        limits: list[tuple[int, int, int]], disk: Path,
    ) -> ExecResult:
        """Run a command tagged as this sandbox's, its output through pipes (nothing on a path the harness can
        write), and kill all it started when it exits, times out, goes over `max_disk_mb` under `disk`, or the
        caller is cancelled."""
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**env, MARKER_ENV: self.name},
                cwd=workdir,
                start_new_session=True,  # its own session and process group: killed as one
                preexec_fn=child_setup(limits),
            )
        except (OSError, ValueError) as exc:
            raise SandboxError(f"cannot start {command[0]!r}: {exc}") from exc
        out, err = bytearray(), bytearray()
        readers = [asyncio.ensure_future(_tail(proc.stdout, out)), asyncio.ensure_future(_tail(proc.stderr, err))]
        limit_mb = self.provider.config.max_disk_mb
        watchdog = asyncio.ensure_future(self._watch_disk(disk, proc.pid, limit_mb)) if limit_mb else None
        try:
            timed_out = not await _exited(proc, timeout_s)
        finally:
            if watchdog is not None:
                watchdog.cancel()
            # Normal exit, timeout or cancellation: nothing it started may keep running.
            self._kill(proc.pid)
            await asyncio.shield(_exited(proc, KILL_WAIT_S))
            # A process that slipped the kill (unisolated) may hold the pipes open: stop reading after a while,
            # and close our ends.
            _, pending = await asyncio.wait(readers, timeout=5)
            for reader in pending:
                reader.cancel()
            if pending:
                proc._transport.close()  # type: ignore[attr-defined]  # asyncio's Process has no public close
        exceeded = watchdog.result() if watchdog and watchdog.done() and not watchdog.cancelled() else None
        return ExecResult(
            exit_code=proc.returncode if proc.returncode is not None else -9,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            timed_out=timed_out and exceeded is None,
            duration_s=time.monotonic() - started,
            limit_exceeded=exceeded,
        )

    async def _watch_disk(self, disk: Path, pgid: int, limit_mb: int) -> str:
        """Measure the disk use under `disk` while a command runs; over the limit, kill the command and say so."""
        while True:
            await asyncio.sleep(DISK_CHECK_S)
            used = await asyncio.to_thread(disk_usage, disk)
            if used > limit_mb * 1024 * 1024:
                self._kill(pgid)
                return f"the rollout's files took {used // (1024 * 1024)} MB, over max_disk_mb {limit_mb}"

    def _kill(self, pgid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        kill_tagged(self.name)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(kill_tagged, self.name)
        for forwarder in self.forwarders.values():
            await forwarder.close()
        if self.relay_dir is not None:
            shutil.rmtree(self.relay_dir, ignore_errors=True)
        if not self.provider.config.keep:
            await asyncio.to_thread(shutil.rmtree, self.root, True)
        self.provider.forget(self)


class LocalProvider(SandboxProvider):
    """Local sandboxes under config.base_dir. `prefix` names this runner's sandboxes (for reaping); `hide`: paths
    masked should they fall under a directory the sandbox can read (the task source, the token files)."""

    def __init__(self, config: LocalSandboxConfig, prefix: str = "rollout", hide: list[Path] | None = None) -> None:
        self.config = config
        self.base_dir = config.base_dir.resolve()
        self.prefix = re.sub(r"[^A-Za-z0-9_.-]", "-", prefix)
        self.hide = [p.resolve() for p in hide or []]
        self.limits = rlimits(config)
        self.drop_to = config.run_as_uid if os.geteuid() == 0 else None
        self.isolated = False  # known after start()
        self.open_sandboxes: dict[str, LocalSandbox] = {}
        # HOME too: a PATH entry such as ~/bin must not widen to the whole home (its keys and tokens).
        protected = [Path.cwd().resolve(), Path.home().resolve(), self.base_dir, *self.hide]
        roots = bwrap.tool_roots(os.environ.get("PATH", ""), protected)
        self.read_only = (*roots, *(p.resolve() for p in config.read_only_paths), Path(netrelay.__file__).resolve())

    @property
    def isolates_network(self) -> bool:
        return self.isolated and self.config.network == "proxy"

    def plan_for(self, rollout_dir: Path) -> bwrap.BwrapPlan | None:
        if not self.isolated:
            return None
        return bwrap.BwrapPlan(
            bwrap="bwrap", rollout_dir=rollout_dir, read_only=self.read_only, hide=tuple(self.hide),
            share_net=self.config.network == "host", drop_to=self.drop_to,
        )

    def grader_plan(self, grader: Path, workspace: Path) -> bwrap.BwrapPlan:
        """The grader's bubblewrap: its own directory (tests and helpers sealed read-only), the workspace, no
        network."""
        return bwrap.BwrapPlan(
            bwrap="bwrap", rollout_dir=grader, read_only=self.read_only, hide=tuple(self.hide), share_net=False,
            binds=((workspace, str(workspace)),), sealed=(grader / "tests", grader / "bin"), drop_to=self.drop_to,
        )

    def make_grader_dir(self, grader: Path, task: Task) -> None:
        """A fresh directory for one grading, out of every harness's reach: the task's tests copied in, an empty
        reward directory, HOME and TMPDIR, and bin/run-candidate."""
        shutil.rmtree(grader, ignore_errors=True)
        grader.mkdir(mode=0o711)
        shutil.copytree(task.tests_dir, grader / "tests")
        for path in [grader / "tests", *(grader / "tests").rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        (grader / "bin").mkdir(mode=0o755)
        helper = grader / "bin" / "run-candidate"
        prefix = bwrap.candidate_argv(shutil.which("bwrap") or "bwrap", grader) if self.isolated else []
        helper.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(w) for w in prefix) + ' "$@"\n')
        helper.chmod(0o755)
        for sub in ("home", "tmp", "logs", "logs/verifier"):
            (grader / sub).mkdir(mode=0o700)
            if self.drop_to is not None:
                os.chown(grader / sub, self.drop_to, self.drop_to)

    async def start(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.base_dir.chmod(0o711)
        self.isolated = True
        plan = self.plan_for(self.base_dir)
        assert plan is not None
        why = await asyncio.to_thread(bwrap.probe, plan)
        if why is not None:
            self.isolated = False
            if not self.config.allow_unisolated:
                raise SandboxError(
                    f"the local sandbox cannot isolate rollouts on this machine: {why}. Fix that, or set "
                    "sandbox.local.allowUnisolated: true to run harnesses as plain subprocesses that can read "
                    "everything this runner's user can"
                )
            log.warning("local sandbox NOT isolated (allowUnisolated): %s", why)
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
        sandbox = LocalSandbox(self, root)
        try:
            root.mkdir(mode=0o700, parents=False)
            for sub in ("home", "workspace", "tmp"):
                (root / sub).mkdir(mode=0o700)
            if task.environment_dir.is_dir():
                shutil.copytree(
                    task.environment_dir, root / "workspace", dirs_exist_ok=True, ignore=shutil.ignore_patterns(".keep")
                )
            sandbox._own(root)
        except OSError as exc:
            shutil.rmtree(root, ignore_errors=True)
            raise SandboxError(f"cannot create a sandbox under {self.base_dir}: {exc}") from exc
        self.open_sandboxes[sandbox.name] = sandbox
        return sandbox

    def forget(self, sandbox: LocalSandbox) -> None:
        self.open_sandboxes.pop(sandbox.name, None)

    async def shutdown(self) -> None:
        for sandbox in list(self.open_sandboxes.values()):
            await sandbox.close()
