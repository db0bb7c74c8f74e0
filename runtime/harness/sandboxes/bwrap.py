"""The bubblewrap command line of the local sandbox (pure), and the check that bubblewrap works here.

What the harness sees: read-only system directories, read-only tool roots (what its CLI needs: the runner's
Python, the directories on PATH outside the system and the install roots their programs resolve to), a fresh
/proc of its own PID namespace, a minimal /dev and /tmp, and read-write its own rollout directory. Nothing else
exists in its mount namespace: no other rollout, no task source, no token file. Hidden paths that fall under a
bound directory are masked. Network: a namespace of its own with only loopback (the proxy arrives through
netrelay.py), unless the pool shares the host's network.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict

# netrelay's sockets inside (short: sun_path is 108 bytes).
RELAY_DIR = "/run/harnessrl-relay"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")


class BwrapPlan(BaseModel):
    """Everything one sandboxed command line depends on."""

    model_config = ConfigDict(frozen=True)

    bwrap: str
    rollout_dir: Path
    read_only: tuple[Path, ...]
    hide: tuple[Path, ...] = ()
    share_net: bool = False
    # Further read-write mounts, host path -> path inside (netrelay's socket directory at RELAY_DIR; a pod's volumes
    # in the API emulator's exec).
    binds: tuple[tuple[Path, str], ...] = ()
    # Paths under rollout_dir bound read-only over it (a grader's tests and helpers).
    sealed: tuple[Path, ...] = ()
    # Set when the runner is root: bwrap keeps CAP_SETUID/SETGID for setpriv, which drops to this uid and gid.
    drop_to: int | None = None
    setpriv: str = "setpriv"


def under(path: Path, roots: list[Path] | tuple[Path, ...]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def install_root(program: Path) -> Path:
    """The directory a resolved program needs whole: its npm prefix (above node_modules), its virtualenv, or
    the directory above its bin/."""
    parts = program.parts
    if "node_modules" in parts:
        return Path(*parts[: parts.index("node_modules")])
    for parent in program.parents:
        if (parent / "pyvenv.cfg").is_file():
            return parent
    return program.parent.parent if program.parent.name == "bin" else program.parent


def venv_home(root: Path) -> Path | None:
    """The Python installation a virtualenv runs on (`home` in its pyvenv.cfg names its bin/)."""
    cfg = root / "pyvenv.cfg"
    if not cfg.is_file():
        return None
    for line in cfg.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return Path(value.strip()).resolve().parent
    return None


def tool_roots(path_env: str, protected: list[Path]) -> list[Path]:
    """Read-only roots for the programs on PATH and the runner's Python. A candidate that contains a protected
    path (the runner's working directory, the sandbox base, a hidden path) is narrowed to the PATH entry itself."""
    system = [Path(d) for d in SYSTEM_DIRS]
    found: set[Path] = set()

    def add(path: Path, fallback: Path) -> None:
        root = path.resolve()
        if root == Path("/") or under(root, system):
            return
        if any(p == root or p.is_relative_to(root) for p in protected):
            path, root = fallback, fallback.resolve()
            if any(p == root or p.is_relative_to(root) for p in protected):
                return
        found.add(root)
        if path.absolute() != root:
            found.add(path.absolute())  # a symlink (.tools -> elsewhere): bound at the path PATH names too
        home = venv_home(root)
        if home is not None and not under(home, system):
            found.add(home)

    for entry in path_env.split(":"):
        d = Path(entry)
        try:
            if not d.is_absolute() or not d.is_dir() or under(d.resolve(), system):
                continue
            programs = sorted(d.iterdir())
        except OSError:  # a PATH entry this user cannot read is no use to its harness either
            continue
        add(d.parent if d.name == "bin" else d, d)
        for program in programs:
            real = program.resolve()
            if real.exists() and not real.is_relative_to(d.resolve()):
                add(install_root(real), real.parent)
    for prefix in (sys.prefix, sys.base_prefix):
        add(Path(prefix), Path(sys.executable).parent)
    return sorted(found)


def _mounts(plan: BwrapPlan) -> list[str]:
    args: list[str] = []
    system = [Path(d) for d in SYSTEM_DIRS]
    for p in system:
        if p.is_symlink():
            args += ["--symlink", str(p.readlink()), str(p)]
        elif p.is_dir():
            args += ["--ro-bind", str(p), str(p)]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    bound: list[Path] = []
    for root in sorted(set(plan.read_only), key=lambda r: len(r.parts)):
        if root.exists() and not under(root, system + bound):
            bound.append(root)
    # The directories leading to each mount, traversable but not listable, whatever their modes on the host (a
    # root runner's harness runs as another uid).
    targets = [*bound, plan.rollout_dir, *(Path(inside) for _, inside in plan.binds)]
    ancestors = {a for target in targets for a in target.parents}
    for a in sorted(ancestors - {Path("/"), Path("/tmp")}, key=lambda a: len(a.parts)):
        if not under(a, system + bound):
            args += ["--perms", "0711", "--dir", str(a)]
    for root in bound:
        args += ["--ro-bind", str(root), str(root)]
    args += ["--bind", str(plan.rollout_dir), str(plan.rollout_dir)]
    for host, inside in plan.binds:
        args += ["--bind", str(host), inside]  # read-write: connect() to a socket on a read-only mount fails
    for path in plan.sealed:
        args += ["--ro-bind", str(path), str(path)]
    for path in plan.hide:
        if not under(path, [*system, *bound, plan.rollout_dir]):
            continue  # not mounted at all
        if path.is_dir():
            args += ["--tmpfs", str(path)]
        elif path.exists():
            args += ["--ro-bind", "/dev/null", str(path)]
    # The root (a tmpfs holding the mount points) read-only: nothing can be written beside the mounts.
    return [*args, "--remount-ro", "/"]


def bwrap_argv(plan: BwrapPlan, argv: list[str], cwd: str) -> list[str]:
    """argv run in the sandbox: new mount, PID, IPC, UTS (and network) namespaces; dies with the runner."""
    ns = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not plan.share_net:
        ns.append("--unshare-net")
    if plan.drop_to is None:
        ns.append("--unshare-user")
        drop: list[str] = []
    else:
        ns += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        u = str(plan.drop_to)
        drop = [plan.setpriv, f"--reuid={u}", f"--regid={u}", "--clear-groups", "--"]
    return [plan.bwrap, *ns, "--die-with-parent", "--new-session", *_mounts(plan), "--chdir", cwd, "--", *drop, *argv]


def candidate_argv(bwrap: str, hidden: Path) -> list[str]:
    """The prefix a grader puts before the candidate's code (`$RUN_CANDIDATE`): run inside the grader's sandbox in
    namespaces of its own, with `hidden` (the grader's tests, reward and helpers) replaced by an empty directory,
    no network, no other process to see or signal, no way to make further namespaces, and nothing left when it
    returns."""
    return [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--disable-userns", "--die-with-parent",
            "--new-session", "--dev-bind", "/", "/", "--tmpfs", "/proc", "--tmpfs", str(hidden),
            "--setenv", "TMPDIR", "/tmp", "--setenv", "HOME", "/tmp", "--"]


def probe(plan: BwrapPlan) -> str | None:
    """None if bubblewrap can build this sandbox here, else why not (in the operator's terms)."""
    if shutil.which(plan.bwrap) is None:
        return f"{plan.bwrap!r} (bubblewrap) is not installed: apt-get install bubblewrap"
    if plan.drop_to is not None and shutil.which(plan.setpriv) is None:
        return f"{plan.setpriv!r} (util-linux) is not installed; a root runner needs it to drop to uid {plan.drop_to}"
    argv = bwrap_argv(plan, ["true"], "/")
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not run: {exc}"
    if res.returncode != 0:
        err = res.stderr.strip()[:300]
        if "mount proc" in err:  # a container's /proc has masked paths: the kernel refuses a fresh proc mount
            return (f"bubblewrap cannot mount a fresh /proc in this container (its /proc is masked; a Pod needs "
                    f"procMount: Unmasked): {err}")
        return f"bubblewrap cannot create namespaces here (user namespaces disabled?): {err}"
    return None
