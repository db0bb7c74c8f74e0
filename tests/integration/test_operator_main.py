"""`harnessrl operator` as a process, as the chart's Deployment runs it: it logs in from a kubeconfig, serves
its liveness endpoint, and reconciles a TrainingRun applied to the API emulator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ports import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(90)


def test_operator_process_serves_liveness_and_reconciles(kube_api: Any, tmp_path: Path) -> None:
    for crd in sorted((ROOT / "crds").glob("*.yaml")):
        kube_api.apply(crd)
    port = free_port()
    log = (tmp_path / "operator.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.cli", "operator", "--standalone", "--namespace", "default",
         "--kubeconfig", str(kube_api.kubeconfig_path), "--liveness", f"http://127.0.0.1:{port}/healthz",
         "--resync-seconds", "1", "--learner-url-template", "http://127.0.0.1:9"],
        stdout=log, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    try:
        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        kube_api.wait_for(healthy, timeout=30, interval=0.2)
        kube_api.apply(ROOT / "examples" / "harnesspools" / "mini-swe-agent.yaml")
        kube_api.apply({
            "apiVersion": "harnessrl.io/v1alpha1", "kind": "TrainingRun",
            "metadata": {"name": "proc-run", "namespace": "default"},
            "spec": {"model": {"base": {"hub": {"repo": "Qwen/Qwen3-0.6B"}}}, "tasks": {"hub": {"repo": "a/t"}},
                     "harnesses": [{"pool": "mini-swe-agent"}]},
        })
        job = kube_api.wait_for(lambda: kube_api.get("batch/v1", "Job", "proc-run-learner", namespace="default"),
                                timeout=30)
        assert job["metadata"]["ownerReferences"][0]["name"] == "proc-run"
        kube_api.wait_for(lambda: (kube_api.get("harnessrl.io/v1alpha1", "TrainingRun", "proc-run", namespace="default")
                                   .get("status") or {}).get("phase") == "Pending", timeout=30)
    finally:
        stop_process(proc)
        log.close()
    output = (tmp_path / "operator.log").read_text()
    assert proc.returncode == 0, output[-3000:]
