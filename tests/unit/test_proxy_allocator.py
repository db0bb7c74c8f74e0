"""The proxy's allocator (allocator.py): the environment it re-executes with, how it tells mimalloc is loaded, and
a real re-execution: same PID, mimalloc mapped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from harnessrl.runtime.proxy.allocator import (
    MARK,
    PURGE_DELAY_MS,
    installable,
    mapped,
    mimalloc_library,
    preload_env,
)

LIBRARY = Path("/venv/lib/libmimalloc.so.3")
ON_LINUX = pytest.mark.skipif(not installable(), reason="cmeel-mimalloc ships wheels for Linux on x86_64 and aarch64")


def test_the_environment_preloads_the_library_and_routes_python_s_small_objects_to_it() -> None:
    env = preload_env({"PATH": "/bin"}, LIBRARY)
    assert env == {"PATH": "/bin", MARK: "mimalloc", "LD_PRELOAD": str(LIBRARY), "PYTHONMALLOC": "malloc",
                   "MIMALLOC_PURGE_DELAY": PURGE_DELAY_MS}


def test_the_caller_s_own_settings_are_kept() -> None:
    env = preload_env({"LD_PRELOAD": "/opt/other.so", "PYTHONMALLOC": "pymalloc", "MIMALLOC_PURGE_DELAY": "0"},
                      LIBRARY)
    assert env is not None
    assert env["LD_PRELOAD"] == f"{LIBRARY} /opt/other.so"
    assert (env["PYTHONMALLOC"], env["MIMALLOC_PURGE_DELAY"]) == ("pymalloc", "0")


def test_a_re_executed_process_never_re_executes_again() -> None:
    assert preload_env({MARK: "mimalloc"}, LIBRARY) is None


def test_mimalloc_counts_as_loaded_only_when_its_library_is_mapped() -> None:
    glibc = "7f00-7f10 r-xp 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6\n7f20-7f30 rw-p 00000000 00:00 0\n"
    assert not mapped(glibc)
    assert not mapped(glibc + "7f40-7f50 r--p 00000000 08:01 13 /tmp/libmimalloc-notes/readme.txt\n")
    assert mapped(glibc + "7f40-7f50 r-xp 00000000 08:01 13 /venv/cmeel.prefix/lib/libmimalloc.so.3.4\n")


@ON_LINUX
def test_the_library_is_installed_with_the_proxy() -> None:
    library = mimalloc_library()
    assert library is not None and library.name == "libmimalloc.so.3"


_REEXEC = """
import os, sys
from harnessrl.runtime.proxy.allocator import mimalloc_loaded, use_mimalloc
print("start", os.getpid(), mimalloc_loaded(), flush=True)
use_mimalloc()
print("running", os.getpid(), mimalloc_loaded(), os.environ.get("PYTHONMALLOC"))
"""


@ON_LINUX
def test_use_mimalloc_re_executes_the_process_once_with_the_library_loaded() -> None:
    out = subprocess.run([sys.executable, "-c", _REEXEC], capture_output=True, text=True, timeout=60, check=True)
    lines = out.stdout.split("\n")
    pid = lines[0].split()[1]
    # The first run had no mimalloc and re-executed; the second, the same process, runs on it and stays.
    assert lines[:3] == [f"start {pid} False", f"start {pid} True", f"running {pid} True malloc"], out
