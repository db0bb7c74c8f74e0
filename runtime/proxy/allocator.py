"""The proxy's memory allocator: mimalloc instead of glibc's malloc, preloaded by re-executing the process.

Every call allocates and frees tens of KB in blocks too big for Python's own small-object allocator: the request
body, the engine's answer (the prompt's ids come back with every answer), the upstream body, token arrays. glibc's
malloc serves those from bins that fragment as thousands of sessions hold such blocks: `perf` showed its
`_int_malloc` alone at 5% of a worker's CPU at 1,000 sessions and 8% at 5,000, so it also made the CPU per call
grow with the sessions held. mimalloc (PyPI's `cmeel-mimalloc`), with Python's small objects handed to it too
(`PYTHONMALLOC=malloc`), cut the proxy's CPU per call by 6% at 1,000 sessions @ 2 s and 11% at 5,000 @ 10 s (so it
no longer grew with the sessions), and its RSS per session by 5-7% at 1,000 sessions
(benchmarks/proxy/README.md, History).

An allocator must be in place before the process's first allocation, so `harnessrl proxy` re-executes itself
once, as it was started (same PID, same arguments), with the library in `LD_PRELOAD`; a replica's workers inherit
that environment. Where there is no library (no wheel for the platform) or it did not load, the proxy runs on the
system allocator and logs why. `ProxyConfig.allocator: system` keeps the system allocator.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

log = logging.getLogger("harnessrl.proxy")

# Set in the environment of the re-executed process, so it never re-executes again (also when the preload failed).
MARK = "HARNESSRL_ALLOCATOR"
LIBRARY_NAME = "libmimalloc.so"
# The machines cmeel-mimalloc ships Linux wheels for; pyproject.toml's marker for it names the same.
WHEEL_MACHINES = ("x86_64", "aarch64")
# mimalloc gives freed memory back to the OS after this many ms; its default, 10, returns memory the next calls
# allocate again. A second still returns a replica's memory soon after its sessions end.
PURGE_DELAY_MS = "1000"


def installable() -> bool:
    """Whether this platform gets cmeel-mimalloc when harnessrl is installed (Linux on WHEEL_MACHINES)."""
    return sys.platform.startswith("linux") and platform.machine() in WHEEL_MACHINES


def mimalloc_library() -> Path | None:
    """The mimalloc shared library installed with the proxy (`cmeel-mimalloc`), or None where there is none."""
    try:
        path = distribution("cmeel-mimalloc").locate_file(f"cmeel.prefix/lib/{LIBRARY_NAME}.3")
    except PackageNotFoundError:
        return None
    library = Path(str(path))
    return library if library.is_file() else None


def preload_env(environ: Mapping[str, str], library: Path) -> dict[str, str] | None:
    """The environment to re-execute with so that `library` is the allocator; None when this process is the
    re-executed one. Settings the caller made (another preload, mimalloc's own options) are kept."""
    if MARK in environ:
        return None
    preload = " ".join(p for p in (str(library), environ.get("LD_PRELOAD", "")) if p)
    return {
        **environ,
        MARK: "mimalloc",
        "LD_PRELOAD": preload,
        "PYTHONMALLOC": environ.get("PYTHONMALLOC", "malloc"),
        "MIMALLOC_PURGE_DELAY": environ.get("MIMALLOC_PURGE_DELAY", PURGE_DELAY_MS),
    }


def mapped(maps: str) -> bool:
    """Whether a process's memory map (the text of /proc/PID/maps) has mimalloc loaded."""
    return any(line.rsplit("/", 1)[-1].startswith(LIBRARY_NAME) for line in maps.splitlines())


def mimalloc_loaded() -> bool:
    """Whether this process runs on mimalloc (False where there is no /proc to tell)."""
    try:
        return mapped(Path("/proc/self/maps").read_text())
    except OSError:
        return False


def use_mimalloc() -> None:
    """Re-execute this process with mimalloc preloaded, unless it runs on it already; returns only when it will
    not (and says why, once it has tried)."""
    if mimalloc_loaded():
        return
    library = mimalloc_library()
    if library is None:
        log.warning("mimalloc is not installed for this platform (cmeel-mimalloc): using the system allocator")
        return
    env = preload_env(os.environ, library)
    if env is None:
        log.warning("%s did not load (LD_PRELOAD): using the system allocator", library)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError as exc:  # returns only on failure; the process is unchanged then
        log.warning("could not re-execute on mimalloc (%s): using the system allocator", exc)
