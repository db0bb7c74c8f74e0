"""Smoke run of the proxy load benchmark (`benchmarks/proxy/run.py --quick`): the engine stand-in (the scripted
vLLM server in fast mode, a stand-in for a real engine) and `harnessrl proxy` as real processes on loopback,
8 sessions (each dialect, streamed and not) x 3 turns against the proxy, through the do-nothing forwarder and
straight to the engine, with spread pauses. Checks the results files have the expected rows, zero errors, and that
every process the run started is gone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.scripted  # the benchmark's subprocess starts the scripted engine


@pytest.mark.timeout(180)
def test_quick_benchmark_writes_its_tables_with_zero_errors(tmp_path: Path) -> None:
    options = ["--quick", "--targets", "baseline,forwarder,harnessrl", "--pause-spread", "0.5"]
    proc = subprocess.run(
        [sys.executable, "benchmarks/proxy/run.py", *options, "--out-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=170, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    results = json.loads((tmp_path / "results.json").read_text())
    assert results["command"].endswith(f"run.py {' '.join(options)} --out-dir {tmp_path}")
    [level] = results["levels"]
    assert (level["sessions"], level["turns"]) == (8, 3)
    by_target = {t["target"]: t for t in level["targets"]}
    assert list(by_target) == ["baseline", "forwarder", "harnessrl"]
    for t in by_target.values():
        assert (t["sessions_finished"], t["errors"], t["cut_at_deadline"], t["calls_ok"]) == (8, 0, 0, 24), t
        assert 0 < t["p50_ms"] <= t["p99_ms"]
    proxy = by_target["harnessrl"]
    assert proxy["p99_added_ms"] == pytest.approx(proxy["p99_ms"] - by_target["baseline"]["p99_ms"])
    assert proxy["cpu_per_call_ms"] > 0 and proxy["rss_per_session_mb"] is not None
    assert 0 <= proxy["kernel_cpu_per_call_ms"] <= proxy["cpu_per_call_ms"]
    assert proxy["server"]["rss_end_mb"] > 0
    # The forwarder is its own process, measured as the proxies are. /proc counts CPU time in 10 ms ticks, and its
    # 24 calls take a few ms, so its figure may read 0 here; that it is measured at all is what is checked: a
    # figure (the baseline's is None), which is its process's CPU time over the calls answered.
    forwarder = by_target["forwarder"]
    assert isinstance(forwarder["cpu_per_call_ms"], float) and forwarder["server"]["rss_end_mb"] > 0
    assert forwarder["cpu_per_call_ms"] == pytest.approx(forwarder["server"]["cpu_s"] / 24 * 1000)
    assert by_target["baseline"]["cpu_per_call_ms"] is None  # no server of its own to measure
    # The proxy's own histograms: every call's engine wait; the journal's every record (sessions, then calls).
    waits = proxy["proxy_waits"]
    assert waits["engine call"]["count"] == 24 and waits["journal"]["count"] == 8 + 24
    assert waits["engine call"]["mean_ms"] > 0 and waits["journal"]["mean_ms"] > 0

    markdown = (tmp_path / "results.md").read_text()
    assert "## 8 sessions, 0.2 s between calls, 3 turns" in markdown
    assert "| baseline | 8/8 | 0 | 0 |" in markdown and "| harnessrl | 8/8 | 0 | 0 |" in markdown
    assert "- harnessrl: its own histograms: engine call mean" in markdown

    # the engine, the forwarder and the proxy, each stopped by PID at the end
    names = sorted(p.split(" pid ")[0] for p in results["processes"])
    assert names == ["engine", "forwarder", "harnessrl"]
    for entry in results["processes"]:
        pid = int(entry.split(" pid ")[1])
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
