"""Operator load benchmark: N TrainingRuns applied at once to the Kubernetes API emulator, against one run alone.

The operator is `harnessrl operator` in its own process (its default workers and resync unless flags say
otherwise), talking to the emulator (tests/kube_emulator) over HTTP as to a cluster. The emulator has no
controllers: "every child exists" is the operator's whole job here. See README.md.

    .venv/bin/python benchmarks/operator/bench.py --runs 100 --idle 60 --out benchmarks/operator/results.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the emulator lives with the tests

from harnessrl.operator.api.harnesspool import HarnessPool  # noqa: E402
from harnessrl.operator.api.trainingrun import TrainingRunSpec  # noqa: E402
from harnessrl.operator.kube import Owner, render  # noqa: E402
from harnessrl.operator.plan import build_plan  # noqa: E402
from harnessrl.operator.plan.placement import ClusterPlacement  # noqa: E402

from tests.kube_emulator.routing import parse_path  # noqa: E402
from tests.kube_emulator.thread import EmulatorThread  # noqa: E402

POOL = yaml.safe_load((ROOT / "examples" / "harnesspools" / "codex.yaml").read_text())
SPEC: dict[str, Any] = {
    "model": {"base": {"hub": {"repo": "Qwen/Qwen3-0.6B"}}},
    "tasks": {"pvc": {"claimName": "tasks", "path": "swe"}},
    "harnesses": [{"pool": POOL["metadata"]["name"]}],
    "grpo": {"steps": 3},
    "engine": {"gpus": 1},
}
# The emulator's storage key (group, plural) of each kind the operator creates for such a run.
STORAGE = {
    "ConfigMap": ("", "configmaps"), "Secret": ("", "secrets"), "Service": ("", "services"),
    "ServiceAccount": ("", "serviceaccounts"), "PersistentVolumeClaim": ("", "persistentvolumeclaims"),
    "StatefulSet": ("apps", "statefulsets"), "Deployment": ("apps", "deployments"), "Job": ("batch", "jobs"),
    "NetworkPolicy": ("networking.k8s.io", "networkpolicies"), "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings"),
}
WRITES = {"POST", "PUT", "PATCH", "DELETE"}


def expected_children(namespace: str) -> set[tuple[str, str]]:
    """(kind, name) of every child of a run named `{run}` (rendered by the operator's own pure functions)."""
    spec = TrainingRunSpec.model_validate(SPEC)
    pools = {POOL["metadata"]["name"]: HarnessPool.model_validate(POOL).spec}
    plan = build_plan("{run}", namespace, spec, pools, ClusterPlacement(namespace))
    names = {(m["kind"], m["metadata"]["name"]) for m in render(plan, Owner(name="{run}", uid="u"))}
    return names | {("Secret", plan.proxy_admin_secret), ("Secret", plan.runner_token_secret)}


@dataclass
class Phase:
    runs: int
    apply_s: float  # applying every run
    all_children_s: float  # from the first apply until every run has every child
    per_run_p50_s: float  # from a run's apply until it has every child
    per_run_max_s: float
    operator_requests: int
    operator_cpu_s: float
    operator_rss_mib: float
    emulator_cpu_s: float  # this process: the emulator's thread (and the light polling)


@dataclass
class Idle:
    seconds: float
    requests_per_min: float
    writes_per_min: float
    writes: list[str]  # what was written at rest (at most 10 distinct), to say why
    run_reconciles_per_min: float  # each reconcile of a run starts with a GET of the run
    operator_cpu_s_per_min: float  # the operator's CPU at rest
    requests_by_resource: dict[str, int]  # "METHOD resource" -> count: what the resyncs cost


def resource(path: str) -> str:
    """The resource a request path names (`.../trainingruns/run-001` -> trainingruns); a discovery path as is."""
    return parse_path(path).plural or path


class Cluster:
    """The emulator, seen over HTTP by the benchmark (its own requests carry its user agent)."""

    def __init__(self, api: EmulatorThread) -> None:
        self.api = api
        self.http = httpx.Client(base_url=api.url, timeout=30.0, headers={"User-Agent": "operator-bench"})

    def apply(self, path: str, body: dict[str, Any]) -> None:
        self.http.post(path, json=body).raise_for_status()

    def namespace(self, name: str) -> None:
        self.apply("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        pool = POOL | {"metadata": {"name": POOL["metadata"]["name"], "namespace": name}}
        self.apply(f"/apis/harnessrl.io/v1alpha1/namespaces/{name}/harnesspools", pool)

    def existing(self, namespace: str) -> set[tuple[str, str]]:
        """(kind, name) of every child-kind object in the namespace, read inside the emulator's thread (polling
        over HTTP would load the emulator with the very LISTs the operator competes with)."""
        def read(emulator: Any) -> set[tuple[str, str]]:
            return {(kind, name) for kind, key in STORAGE.items()
                    for ns, name in emulator.store.objects[key] if ns == namespace}
        return self.api.call(read)

    def operator_requests(self) -> list[tuple[str, str]]:
        """(method, path) of every request the operator made so far, in order."""
        return [(str(getattr(r.method, "value", r.method)), r.url.path) for r in list(self.api.emulator._requests)
                if r.headers.get("User-Agent", "") != "operator-bench"]


@contextmanager
def operator(kubeconfig: Path, log: Path, extra: list[str]) -> Iterator[psutil.Process]:
    argv = [sys.executable, "-m", "harnessrl.cli", "operator", "--all-namespaces", "--standalone",
            "--kubeconfig", str(kubeconfig), "--learner-url-template", "http://127.0.0.1:9", *extra]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONUNBUFFERED": "1"},
                                start_new_session=True)
    try:
        yield psutil.Process(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def phase(cluster: Cluster, proc: psutil.Process, namespace: str, runs: int, timeout: float) -> Phase:
    cluster.namespace(namespace)
    template = expected_children(namespace)
    names = [f"run-{i:03d}" for i in range(runs)]
    want = {n: {(k, c.replace("{run}", n)) for k, c in template} for n in names}
    requests_before, cpu_before = len(cluster.operator_requests()), sum(proc.cpu_times()[:2])
    own_cpu_before = sum(psutil.Process().cpu_times()[:2])
    start, applied = time.monotonic(), {}
    for name in names:
        body = {"apiVersion": "harnessrl.io/v1alpha1", "kind": "TrainingRun",
                "metadata": {"name": name, "namespace": namespace}, "spec": SPEC}
        cluster.apply(f"/apis/harnessrl.io/v1alpha1/namespaces/{namespace}/trainingruns", body)
        applied[name] = time.monotonic()
    apply_s = time.monotonic() - start
    done: dict[str, float] = {}
    rss = 0.0
    while len(done) < runs and time.monotonic() - start < timeout:
        have = cluster.existing(namespace)
        now = time.monotonic()
        done |= {n: now for n in names if n not in done and want[n] <= have}
        rss = max(rss, proc.memory_info().rss / 2**20)
        time.sleep(0.2)
    if len(done) < runs:
        raise SystemExit(f"{runs - len(done)} of {runs} runs still lack children after {timeout:.0f} s")
    latencies = [done[n] - applied[n] for n in names]
    return Phase(runs=runs, apply_s=round(apply_s, 2), all_children_s=round(max(done.values()) - start, 2),
                 per_run_p50_s=round(statistics.median(latencies), 2), per_run_max_s=round(max(latencies), 2),
                 operator_requests=len(cluster.operator_requests()) - requests_before,
                 operator_cpu_s=round(sum(proc.cpu_times()[:2]) - cpu_before, 2), operator_rss_mib=round(rss, 1),
                 emulator_cpu_s=round(sum(psutil.Process().cpu_times()[:2]) - own_cpu_before, 2))


def idle(cluster: Cluster, proc: psutil.Process, seconds: float) -> Idle:
    """Requests the operator makes with nothing to do (resyncs), and its CPU, per minute."""
    before, cpu_before = cluster.operator_requests(), sum(proc.cpu_times()[:2])
    time.sleep(seconds)
    cpu = sum(proc.cpu_times()[:2]) - cpu_before
    new = cluster.operator_requests()[len(before):]
    per_min = 60.0 / seconds
    writes = [f"{m} {p}" for m, p in new if m in WRITES]
    reconciles = sum(1 for m, p in new if m == "GET" and "/trainingruns/" in p)
    by_resource = collections.Counter(f"{m} {resource(p)}" for m, p in new)
    return Idle(seconds=seconds, requests_per_min=round(len(new) * per_min, 1),
                writes_per_min=round(len(writes) * per_min, 1), writes=sorted(set(writes))[:10],
                run_reconciles_per_min=round(reconciles * per_min, 1), operator_cpu_s_per_min=round(cpu * per_min, 1),
                requests_by_resource=dict(by_resource.most_common()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100, help="TrainingRuns applied at once in the load phase")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after the load before counting at rest "
                        "(the last runs' status catches up)")
    parser.add_argument("--idle", type=float, default=60.0, help="seconds at rest after the load, to count requests")
    parser.add_argument("--timeout", type=float, default=900.0, help="give up on a phase after this many seconds")
    parser.add_argument("--operator-arg", action="append", default=[], help="extra `harnessrl operator` flag")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmulatorThread(history_limit=1_000_000) as api:
        cluster = Cluster(api)
        for crd in sorted((ROOT / "crds").glob("*.yaml")):
            cluster.apply("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", yaml.safe_load(crd.read_text()))
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig())
        with operator(kubeconfig, Path(tmp) / "operator.log", args.operator_arg) as proc:
            time.sleep(3)  # kopf discovers the CRDs and starts its watches
            print("baseline: 1 run", flush=True)
            baseline = phase(cluster, proc, "baseline", 1, args.timeout)
            print(f"  {asdict(baseline)}\nload: {args.runs} runs at once", flush=True)
            load = phase(cluster, proc, "load", args.runs, args.timeout)
            print(f"  {asdict(load)}\nidle: {args.idle:.0f} s after {args.settle:.0f} s", flush=True)
            time.sleep(args.settle)
            rest = idle(cluster, proc, args.idle)
            print(f"  {asdict(rest)}", flush=True)
    result = {
        "command": " ".join(["benchmarks/operator/bench.py", *sys.argv[1:]]),
        "machine": f"{platform.machine()}, {psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=ROOT).stdout.strip(),
        "baseline": asdict(baseline), "load": asdict(load), "idle": asdict(rest),
        "ratios": {
            "emulator_busy": round(load.emulator_cpu_s / load.all_children_s, 2),
            "all_children_vs_one_run": round(load.all_children_s / baseline.all_children_s, 1),
            "requests_per_run_vs_one_run": round(load.operator_requests / load.runs / baseline.operator_requests, 2),
        },
    }
    print(json.dumps(result["ratios"]))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
