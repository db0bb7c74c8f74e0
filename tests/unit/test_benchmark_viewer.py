"""benchmarks/viewer/bench.py on a small generated run: every rollout is in the index each time the run is
opened, and every page was measured."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

# Loaded under its own name: other benchmarks' scripts are `bench` modules too.
_spec = importlib.util.spec_from_file_location(
    "viewer_bench", Path(__file__).resolve().parents[2] / "benchmarks" / "viewer" / "bench.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_a_small_run_is_generated_opened_twice_and_each_page_timed(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert bench.main(["--rollouts", "40", "--calls", "2", "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["rollouts"] == 41 and r["journal_bytes"] > 0
    from harnessrl.runtime.viewer.index import RunIndex

    index = RunIndex(tmp_path / "work" / "run")
    rows = index.refresh()
    assert len(rows) == 41 and len(index.calls(index.rows[bench.BIG].session_id)) == 200
    for opened in ("first_open", "second_open"):
        assert r[opened]["index_cpu_s"] > 0
        assert set(r[opened]["pages_cpu_wall_s"]) == {"list, filtered and sorted", "list page 100", "run",
                                                      "rollout of 200 calls"}
