"""weightSync restart: the published policy file and the engine config that serves it (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest
from harnessrl.runtime.contracts.engine_config import EngineConfig, LoraSettings
from harnessrl.runtime.contracts.engine_launch import engine_argv
from harnessrl.runtime.engine.restart import PublishedPolicy, engine_on, read_published, write_published
from pydantic import ValidationError

BASE = EngineConfig(model="/models/tiny", served_model_name="policy", lora=LoraSettings(enabled=False, max_rank=8))


def test_an_adapter_is_served_next_to_the_base_model_under_the_name_the_proxy_asks_for() -> None:
    policy = PublishedPolicy(version=3, model="policy-v3", path="/ck/sync/policy-v3", adapter=True, written_at=1.0)
    argv = engine_argv(engine_on(BASE, policy))
    assert argv[argv.index("--model") + 1] == "/models/tiny"
    assert "--enable-lora" in argv and argv[argv.index("--max-lora-rank") + 1] == "8"
    assert argv[argv.index("--lora-modules") + 1] == "policy-v3=/ck/sync/policy-v3"
    # Built from the base config each time: a second restart does not stack adapters.
    later = PublishedPolicy(version=4, model="policy-v4", path="/ck/sync/policy-v4", adapter=True, written_at=2.0)
    assert engine_argv(engine_on(BASE, later)).count("--lora-modules") == 1


def test_full_weights_replace_the_base_model_and_keep_its_tokenizer_and_name() -> None:
    policy = PublishedPolicy(version=2, model="policy", path="/ck/sync/policy-v2", adapter=False, written_at=1.0)
    argv = engine_argv(engine_on(BASE, policy))
    assert argv[argv.index("--model") + 1] == "/ck/sync/policy-v2"
    assert argv[argv.index("--tokenizer") + 1] == "/models/tiny"
    assert argv[argv.index("--served-model-name") + 1] == "policy" and "--enable-lora" not in argv
    own = BASE.model_copy(update={"extra_args": ["--tokenizer", "/tok"]})
    assert engine_argv(engine_on(own, policy)).count("--tokenizer") == 1


def test_published_policy_round_trips_atomically_and_is_validated(tmp_path: Path) -> None:
    assert read_published(tmp_path) is None
    policy = PublishedPolicy(version=5, model="policy-v5", path=str(tmp_path / "p"), adapter=True, written_at=9.0)
    write_published(tmp_path, policy)
    assert read_published(tmp_path) == policy
    assert [p.name for p in tmp_path.iterdir()] == ["policy.json"]
    (tmp_path / "policy.json").write_text('{"version": 0, "model": "x", "path": "/p", "adapter": true, "written_at": 0}')
    with pytest.raises(ValidationError, match="version"):
        read_published(tmp_path)
