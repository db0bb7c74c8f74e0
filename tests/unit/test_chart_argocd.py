"""The Argo CD health checks of the chart README, run in LuaJIT (Lua 5.1, as Argo CD's gopher-lua) against
statuses the operator's own status code writes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from harnessrl.operator.api.harnesspool import PoolRolloutCounts
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.handlers.status import Observed, pool_status, run_status

from tests.unit.test_operator_status import learner_status

lupa = pytest.importorskip("lupa.luajit21")

CHART = Path(__file__).resolve().parents[2] / "charts" / "harnessrl"
SPEC = TrainingRunSpec.model_validate(
    {"model": {"base": {"hub": {"repo": "a/b"}}}, "tasks": {"hub": {"repo": "a/t"}}, "harnesses": [{"pool": "p"}]}
)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
READY = {"spec": {"replicas": 1}, "status": {"readyReplicas": 1}}


def health(script: str, obj: dict[str, Any]) -> tuple[str, str]:
    lua = lupa.LuaRuntime()
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute((CHART / "argocd" / script).read_text())
    return result["status"], result["message"]


def run(status: Any, generation: int = 1) -> dict[str, Any]:
    return {"metadata": {"generation": generation}, "status": status.model_dump(mode="json", by_alias=True, exclude_none=True)}


def test_scripts_in_readme_are_the_tested_ones() -> None:
    readme = (CHART / "README.md").read_text()
    for script in ("trainingrun-health.lua", "harnesspool-health.lua"):
        for line in (CHART / "argocd" / script).read_text().splitlines():
            assert line.strip() in readme


def test_trainingrun_health() -> None:
    job_ready = {"status": {"ready": 1}}
    crash = {"metadata": {"name": "r-engine-0", "labels": {"harnessrl.io/component": "engine"}},
             "status": {"containerStatuses": [{"name": "vllm", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}
    cases = {
        "Progressing": Observed(),
        "Healthy": Observed(engine=READY, proxy=READY, runners={"p": READY}, learner=job_ready,
                            progress=learner_status(step=1, policy_version=1)),
        "Degraded": Observed(engine={"spec": {"replicas": 1}}, proxy=READY, runners={"p": READY}, pods=[crash]),
    }
    for expected, observed in cases.items():
        assert health("trainingrun-health.lua", run(run_status(SPEC, 1, None, observed, T0)))[0] == expected
    complete = run_status(SPEC, 1, None, Observed(learner={"status": {"conditions": [{"type": "Complete", "status": "True"}]}}), T0)
    assert health("trainingrun-health.lua", run(complete)) == ("Healthy", "the learner finished 100 steps")
    failed = run_status(SPEC, 1, None, Observed(learner={"status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}), T0)
    assert health("trainingrun-health.lua", run(failed))[0] == "Degraded"
    suspended = run_status(SPEC.model_copy(update={"suspend": True}), 2, None, Observed(), T0)
    assert health("trainingrun-health.lua", run(suspended, generation=2))[0] == "Suspended"
    # A spec the operator has not acted on yet is Progressing whatever the old status says.
    assert health("trainingrun-health.lua", run(complete, generation=2))[0] == "Progressing"
    assert health("trainingrun-health.lua", {"metadata": {}})[0] == "Progressing"


def test_harnesspool_health() -> None:
    ready = pool_status(1, None, "p", [READY], [], PoolRolloutCounts(), T0)
    unused = pool_status(1, None, "p", [], [], PoolRolloutCounts(), T0)
    pull = {"metadata": {"name": "r-p-runner-x"}, "status": {"containerStatuses": [
        {"name": "runner", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}}
    broken = pool_status(1, None, "p", [{"spec": {"replicas": 1}, "status": {}}], [pull], PoolRolloutCounts(), T0)
    assert health("harnesspool-health.lua", run(ready))[0] == "Healthy"
    assert health("harnesspool-health.lua", run(unused))[0] == "Healthy"
    assert health("harnesspool-health.lua", run(broken))[0] == "Degraded"
