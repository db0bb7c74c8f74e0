"""Where a server spends its CPU under load: py-spy samples it (non-blocking) while a level runs, and the
collapsed stacks are summarised as self and inclusive shares by function and by package."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]*)(?::\d+)?\)$")


class PySpy:
    def __init__(self, pid: int, output: Path, rate: int = 100, gil: bool = False) -> None:
        self.output = output
        pyspy = Path(sys.executable).parent / "py-spy"
        argv = [
            str(pyspy),
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--nonblocking",
            *(["--gil"] if gil else []),
            "--subprocesses",  # a replica of several workers: the supervisor is idle, its workers do the work
            "--format",
            "raw",
            "--output",
            str(output),
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> str:
        """Stop sampling (py-spy writes its output on SIGINT) and return the summary."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if not self.output.exists():
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            return f"py-spy wrote no samples: {err[-500:]}"
        # py-spy writes file paths as the OS gives them, not necessarily UTF-8.
        return summarize(self.output.read_text(errors="replace"))


def _frame(raw: str) -> tuple[str, str]:
    m = _FRAME.match(raw.strip())
    if not m:
        return raw.strip(), "?"
    return m["func"], m["file"]


def package(file: str) -> str:
    """Where a frame's code lives: `harnessrl proxy/app.py` for this project, else the top-level package or
    module (py-spy prints paths relative to sys.path: `pydantic/main.py` -> pydantic, `json/decoder.py` -> json)."""
    parts = file.replace("\\", "/").split("/")
    if "runtime" in parts:
        return "harnessrl " + "/".join(parts[parts.index("runtime") + 1 :])
    if "site-packages" in parts:
        parts = parts[parts.index("site-packages") + 1 :] or parts
    return parts[0].removesuffix(".py")


def summarize(raw: str, top: int = 25) -> str:
    self_fn: Counter[str] = Counter()
    incl_fn: Counter[str] = Counter()
    self_pkg: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        # `--subprocesses` roots each stack in its process ("process PID:cmdline"): sum the workers together.
        frames = [_frame(f) for f in stack.split(";") if not f.startswith("process ")]
        if not frames:
            continue
        total += count
        func, file = frames[-1]
        self_fn[f"{func} ({package(file)})"] += count
        self_pkg[package(file)] += count
        for name in {f"{fn} ({package(fl)})" for fn, fl in frames}:
            incl_fn[name] += count
    if not total:
        return "no samples"

    def table(counter: Counter[str], title: str) -> list[str]:
        rows = [f"| {title} | share |", "|---|---|"]
        rows += [f"| `{name}` | {n / total:.1%} |" for name, n in counter.most_common(top)]
        return rows

    return "\n".join(
        [
            f"{total} CPU samples (idle time not sampled).",
            "",
            *table(self_pkg, "self time by package / module"),
            "",
            *table(self_fn, "self time by function"),
            "",
            *table(incl_fn, "inclusive time by function"),
        ]
    )
