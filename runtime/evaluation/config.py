"""EvalConfig: what one eval coordinator process evaluates (`python -m harnessrl.runtime.evaluation.coordinator --config
FILE`, rendered by `harnessrl eval` or the operator)."""

from __future__ import annotations

from pathlib import Path

import yaml
from harnessrl.runtime.contracts.coordinator import PoolHarness
from pydantic import BaseModel, ConfigDict, Field


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str = Field(min_length=1, max_length=253, description="what is evaluated: 'base' or a checkpoint name")
    pools: list[PoolHarness] = Field(min_length=1, max_length=64)
    task_ids: list[str] = Field(min_length=1, max_length=100_000)
    attempts: int = Field(1, ge=1, le=64, description="samples per task and pool")
    model: str = Field(min_length=1, max_length=512, description="model name leases tell harnesses to request")
    policy_version: int = Field(0, ge=0)
    proxy_url: str = Field(min_length=1, description="proxy base URL runners create sessions at")
    lease_ttl_s: float = Field(
        90.0, gt=0, description="a lease its runner stops renewing (the runner died) is handed out again after this long"
    )
    max_unscored: int = Field(3, ge=1, le=100, description="infra/grader failures of a rollout before it is given up")
    retry_after_s: float = Field(1.0, ge=0)
    # Accepted completions, one JSON line each: a restarted coordinator replays them and loses nothing.
    journal: Path
    # Written (atomically) whenever the evaluation finishes: the EvalResults JSON.
    results: Path
    runner_token_file: Path = Field(description="the runners' credential: leases and completions need it")
    host: str = "127.0.0.1"
    port: int = Field(8090, ge=0, le=65535)
    log_level: str = Field("info", pattern=r"^(debug|info|warning|error)$")


def load_config(path: Path) -> EvalConfig:
    return EvalConfig.model_validate(yaml.safe_load(Path(path).read_text()) or {})
