"""Weight sync by restart: the learner publishes each policy version to a directory, with `policy.json` naming
the newest; whoever runs the engines (the operator, `harnessrl run`) restarts them on it. Pure: no vLLM import.

An adapter is served next to the base model (`--lora-modules <name>=<path>`, under the name the proxy asks
for); full weights replace the base model under the same served name (the tokenizer stays the base model's).
"""

from __future__ import annotations

from pathlib import Path

from harnessrl.runtime.contracts.engine_config import EngineConfig
from pydantic import BaseModel, Field

POLICY_FILE = "policy.json"


class PublishedPolicy(BaseModel):
    """`policy.json`: the newest policy version the learner wrote and where its weights are."""

    version: int = Field(ge=1)
    model: str = Field(min_length=1, description="the name requests use: `<served>-v<N>` for an adapter")
    path: str = Field(min_length=1, description="absolute directory of the adapter or the full weights")
    adapter: bool
    written_at: float


def sync_dir(checkpoint_dir: Path) -> Path:
    """Where published policies live (the LoRA adapters the engines load, or restart sync's `policy.json`)."""
    return checkpoint_dir / "sync"


def write_published(sync_dir: Path, policy: PublishedPolicy) -> None:
    """Atomically: an engine restarter never reads a half-written file."""
    tmp = sync_dir / f".{POLICY_FILE}.tmp"
    tmp.write_text(policy.model_dump_json())
    tmp.replace(sync_dir / POLICY_FILE)


def read_published(sync_dir: Path) -> PublishedPolicy | None:
    """The newest published policy, or None before the first one."""
    path = sync_dir / POLICY_FILE
    return PublishedPolicy.model_validate_json(path.read_text()) if path.exists() else None


def engine_on(base: EngineConfig, policy: PublishedPolicy) -> EngineConfig:
    """The engine's config serving `policy`, from the config it serves the base model with."""
    if policy.adapter:
        lora = base.lora.model_copy(update={"enabled": True})
        args = [*base.extra_args, "--lora-modules", f"{policy.model}={policy.path}"]
        return base.model_copy(update={"lora": lora, "extra_args": args})
    keep_tokenizer = [] if "--tokenizer" in base.extra_args else ["--tokenizer", base.model]
    return base.model_copy(update={"model": policy.path, "extra_args": [*base.extra_args, *keep_tokenizer]})
