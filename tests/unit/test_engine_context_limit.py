"""engine.maxModelLen against the model's own config: vLLM refuses to start past the positions the config allows
(`_get_and_verify_max_len`), and the tiny test model allows 65,536, so no CPU test met the limit. Qwen3-8B allows
40,960; both GPU examples asked for 65,536.

Here: the limit as vLLM itself derives it (vLLM's ModelConfig on copies of the tiny model's config), the
operator's refusal (a PlanError whose reason becomes the condition), and `harnessrl run`'s, from the downloaded
model's config.json."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from harnessrl.operator.api.enginepool import EnginePoolSpec
from harnessrl.operator.api.reasons import CONTEXT_TOO_LONG
from harnessrl.operator.plan.engine import build_engine_pool_plan
from harnessrl.operator.plan.placement import ClusterPlacement
from harnessrl.operator.plan.types import ContextTooLong
from harnessrl.runtime.contracts.learner_memory import KNOWN_SHAPES, context_limit

from harnessrl.local.run import main
from tests.unit.test_local_plan import args
from tests.unit.test_operator_plan import EXAMPLE, ROOT, example_plan

# Variants of a config.json's length keys and rope scaling, each with the limit it must give.
CONFIGS: list[tuple[dict[str, Any], int]] = [
    ({"max_position_embeddings": 40960, "rope_scaling": None}, 40960),  # Qwen3-8B
    ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, 16384),
    ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, 8192),
    # YaRN's max_position_embeddings is already the scaled length: the factor is not applied again.
    ({"max_position_embeddings": 131072,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 131072),
    ({"max_position_embeddings": 8192, "seq_length": 2048}, 2048),  # the smallest length key wins
]


def model_copy(src: Path, dst: Path, changes: dict[str, Any]) -> Path:
    """The tiny model's config and tokenizer (no weights: vLLM's ModelConfig reads none) with `changes`."""
    dst.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        shutil.copy(src / name, dst / name)
    config = json.loads((src / "config.json").read_text())
    config.pop("rope_parameters", None)  # transformers rebuilds it from rope_scaling and rope_theta
    (dst / "config.json").write_text(json.dumps(config | {"rope_theta": 10000.0} | changes))
    return dst


def test_the_limit_is_the_one_vllm_derives_and_vllm_refuses_past_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    from vllm.config import ModelConfig

    for i, (changes, expected) in enumerate(CONFIGS):
        model = model_copy(tiny_model_dir, tmp_path / f"m{i}", changes)
        assert context_limit(json.loads((model / "config.json").read_text())) == expected, changes
        assert ModelConfig(model=str(model), tokenizer=str(model)).max_model_len == expected, changes
    # What the operator refuses, vLLM refuses too (the examples' 65,536 on a 40,960-position model).
    model = tmp_path / "m0"
    with pytest.raises(ValueError, match="max_model_len \\(40961\\) is greater than the derived max_model_len"):
        ModelConfig(model=str(model), tokenizer=str(model), max_model_len=40961)
    assert ModelConfig(model=str(model), tokenizer=str(model), max_model_len=40960).max_model_len == 40960


def test_the_operator_refuses_a_context_past_the_models_positions_with_a_reason() -> None:
    engine = EXAMPLE["spec"]["engine"]
    with pytest.raises(ContextTooLong, match=re.escape("engine.maxModelLen 65536 exceeds the 40960 positions "
                                                       "Qwen/Qwen3-8B's config allows")) as info:
        example_plan(engine=engine | {"maxModelLen": 65536})
    assert info.value.reason == CONTEXT_TOO_LONG == "ContextTooLong"
    assert example_plan(engine=engine | {"maxModelLen": 40960}).engine.config.max_model_len == 40960
    # vLLM's own override, set on the servers, is the user's to take.
    allowed = engine | {"maxModelLen": 65536, "env": [{"name": "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "value": "1"}]}
    assert example_plan(engine=allowed).engine.config.max_model_len == 65536
    # A model the operator has no config of is left to vLLM.
    other = EXAMPLE["spec"]["model"] | {"base": {"hub": {"repo": "org/unknown"}}}
    assert example_plan(model=other, engine=engine | {"maxModelLen": 65536}).engine is not None
    # An EnginePool's servers are checked the same way.
    pool = yaml.safe_load((ROOT / "examples" / "enginepools" / "qwen3-8b.yaml").read_text())["spec"]
    with pytest.raises(ContextTooLong):
        build_engine_pool_plan("p", "team", EnginePoolSpec.model_validate(
            pool | {"engine": pool["engine"] | {"maxModelLen": 65536}}), ClusterPlacement("team"))


def test_the_gpu_examples_fit_their_models_positions() -> None:
    positions = KNOWN_SHAPES["Qwen/Qwen3-8B"].max_positions
    assert positions == 40960
    for path in ("trainingrun.yaml", "enginepools/qwen3-8b.yaml"):
        spec = yaml.safe_load((ROOT / "examples" / path).read_text())["spec"]
        assert spec["model"]["base"]["hub"]["repo"] == "Qwen/Qwen3-8B"
        assert spec["engine"]["maxModelLen"] <= positions, path


def test_harnessrl_run_refuses_it_from_the_downloaded_models_config(tiny_model_dir: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # The quickstart asks for 8,192 tokens; this model's config allows 4,096.
    model = model_copy(tiny_model_dir, tmp_path / "model", {"max_position_embeddings": 4096})
    a = args(tmp_path, model)
    argv = [str(f) for f in a.files] + ["--run-dir", str(a.run_dir), *[f"--volume={v}" for v in a.volume]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"engine.maxModelLen 8192 exceeds the 4096 positions {model / 'config.json'} allows" in err
    assert not (a.run_dir / "plan.json").exists()  # nothing was planned, nothing started
