"""What `harnessrl view` costs on a large run: a generated run directory of N rollouts (each of C calls, the
second and later continuing the one before), written by the writers a run uses (the proxy's sessions and
journal encoding, the coordinator's journal), and one rollout of 200 calls.

    python benchmarks/viewer/bench.py --rollouts 100000 --out benchmarks/viewer/results.json   # ~4 min here
    python benchmarks/viewer/bench.py --rollouts 200 --out tiny.json                           # make test's smoke run

Each figure is measured in a process of its own (`measure`), twice: the first open of the run (the index built
from the journals) and the second (from the index the first saved, where building it took long enough to be
saved: runtime/viewer/index.py), then the pages, through the app; CPU and wall seconds each.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harnessrl.runtime.contracts.coordinator import Completion, OutcomeKind
from harnessrl.runtime.contracts.proxy import CreateSessionRequest
from harnessrl.runtime.coordinator.journal import Journal, JournalEntry
from harnessrl.runtime.proxy.journal import Journal as ProxyJournal
from harnessrl.runtime.proxy.sessions import SessionStore
from harnessrl.runtime.trajectory.models import Turn

HARNESSES = ("claude-code", "codex", "mini-swe-agent")
GROUP = 8
BIG = "g9999999-r000"  # the rollout of 200 calls


def write_rollout(store: SessionStore, journal: Journal, out: Any, seq: int, rollout_id: str, harness: str,
                  calls: int, version: int) -> None:
    group = rollout_id.split("-r")[0]
    session, record = store.create(CreateSessionRequest(rollout_id=rollout_id, task_id=f"task-{seq % 50}",
                                                        harness=harness, group_id=group), at=float(seq))
    out.write(ProxyJournal.encode(record))
    prompt, completion = list(range(1, 200)), list(range(300, 400))
    for _ in range(calls):
        turn = Turn(prompt_ids=prompt, completion_ids=completion, logprobs=[-0.1] * len(completion),
                    policy_version=version)
        out.write(ProxyJournal.encode(session.record_call(answered=True, turn=turn)))
        prompt = prompt + completion + [5, 6, 7]
    solved = seq % 2 == 0
    journal.append(JournalEntry(seq=seq, harness=harness, sequences=session.sequences().sequences,
                                completion=Completion(rollout_id=rollout_id, lease_id=f"{rollout_id}.a1",
                                                      session_id=session.id, correctness=float(solved),
                                                      outcome=OutcomeKind.solved if solved else OutcomeKind.wrong,
                                                      grader_output="PASS" if solved else "FAIL")))
    store.end(session.id, "done")


def generate(run: Path, rollouts: int, calls: int) -> None:
    (run / "journal").mkdir(parents=True)
    store = SessionStore(default_budget=1000, ttl_s=1e9)
    journal = Journal(run / "checkpoints" / "journal.jsonl", fsync=False)
    with (run / "journal" / "proxy-0.jsonl").open("wb") as out:
        for n in range(rollouts):
            g, slot = divmod(n, GROUP)
            write_rollout(store, journal, out, n + 1, f"g{g:07d}-r{slot:03d}", HARNESSES[g % len(HARNESSES)], calls,
                          g // 100)
        write_rollout(store, journal, out, rollouts + 1, BIG, HARNESSES[0], 200, 0)
    journal.close()


def timed(f: Any) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    f()
    return round(time.process_time() - cpu, 3), round(time.perf_counter() - wall, 3)


def measure(run: Path) -> dict[str, Any]:
    """In this process: the index (from the journals, or from a saved index), then each page."""
    from fastapi.testclient import TestClient
    from harnessrl.runtime.viewer.app import create_app
    from harnessrl.runtime.viewer.index import RunIndex

    index_cpu, index_wall = timed(lambda: RunIndex(run).refresh())
    client = TestClient(create_app(run))
    pages = {
        "list, filtered and sorted": "/api/rollouts?harness=codex&solved=true&sort=reward&order=desc",
        "list page 100": "/rollouts?page=100",
        "run": "/",
        "rollout of 200 calls": f"/rollouts/{BIG}",
    }
    client.get("/api/metrics")  # the app's own index
    out: dict[str, Any] = {"index_cpu_s": index_cpu, "index_wall_s": index_wall, "pages_cpu_wall_s": {}}
    for name, url in pages.items():
        out["pages_cpu_wall_s"][name] = timed(lambda url=url: client.get(url).raise_for_status())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=4, help="calls per rollout")
    parser.add_argument("--work", type=Path, default=None, help="where to generate the run (default: a temp dir)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # run by main: one measurement
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return 0
    import tempfile

    work = args.work or Path(tempfile.mkdtemp(prefix="viewer-bench-"))
    run = work / "run"
    try:
        generate_s = timed(lambda: generate(run, args.rollouts, args.calls))[1]
        size = sum(p.stat().st_size for p in run.rglob("*.jsonl"))

        def measured() -> dict[str, Any]:
            done = subprocess.run([sys.executable, "-P", __file__, "--measure", str(run), "--out", "-"], check=True,
                                  capture_output=True, text=True, timeout=1800)
            return json.loads(done.stdout)

        first = measured()
        saved = (run / "viewer" / "index.json").stat().st_size if (run / "viewer" / "index.json").exists() else 0
        report = {
            "rollouts": args.rollouts + 1, "calls_per_rollout": args.calls, "journal_bytes": size,
            "generate_s": generate_s, "saved_index_bytes": saved,
            "first_open": first, "second_open": measured(),
            "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        }
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
