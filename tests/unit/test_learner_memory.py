"""The learner's memory plan (runtime/contracts/learner_memory.py) and the operator's refusal of a spec that cannot fit."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.plan.memory import LearnerMemoryError, check_learner_memory
from harnessrl.runtime.contracts.learner_memory import (
    GIB,
    KNOWN_SHAPES,
    ModelShape,
    TrainingSetup,
    fits,
    plan_memory,
)

from tests.unit.test_operator_plan import EXAMPLE, ROOT, example_plan

QWEN3_8B = KNOWN_SHAPES["Qwen/Qwen3-8B"]


def setup(**kw: object) -> TrainingSetup:
    base: dict[str, object] = {"lora_rank": 32, "micro_batch_tokens": 16384, "max_sequence_tokens": 65536,
                               "gradient_checkpointing": True, "gpus": 1, "gpu_memory_bytes": 80 * GIB}
    return TrainingSetup.model_validate(base | kw)


def test_shape_counts_the_parameters_of_its_config() -> None:
    # Qwen3-8B's published size is 8.19 B parameters; its config.json gives the same shape.
    assert QWEN3_8B.parameters() == pytest.approx(8.19e9, rel=0.002)
    assert ModelShape.from_config({"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
                                   "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
                                   "vocab_size": 151936, "tie_word_embeddings": False,
                                   "max_position_embeddings": 40960, "rope_scaling": None}) == QWEN3_8B
    # LoRA r=32 on all seven projections: 87 M trainable parameters.
    assert QWEN3_8B.lora_parameters(32, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                         "down_proj"]) == pytest.approx(87.3e6, rel=0.01)


def test_terms_follow_lora_full_checkpointing_and_gpus() -> None:
    lora = plan_memory(QWEN3_8B, setup())
    full = plan_memory(QWEN3_8B, setup(lora_rank=None))
    # Full fine-tuning: fp32 master + grads + AdamW = 16 bytes per parameter; LoRA: only the adapter's.
    assert full.trainable_states == 16 * QWEN3_8B.parameters() and lora.trainable_states < full.trainable_states / 90
    assert plan_memory(QWEN3_8B, setup(lora_rank=None, gpus=8)).trainable_states == full.trainable_states // 8
    no_ckpt = plan_memory(QWEN3_8B, setup(gradient_checkpointing=False))
    assert no_ckpt.activations > 10 * lora.activations
    # A micro-batch never cuts a sequence: a 64k sequence is one micro-batch even under a 16k budget.
    assert lora.micro_batch_tokens == 65536
    assert plan_memory(QWEN3_8B, setup(max_sequence_tokens=8192)).activations < lora.activations / 3


def test_flagship_example_fits_after_the_micro_batch_split_and_not_before() -> None:
    # examples/trainingrun.yaml: Qwen3-8B, LoRA r=32, 40,960-token context, one 80 GB GPU, maxTokensPerStep 2M.
    spec = TrainingRunSpec.model_validate(EXAMPLE["spec"])
    plan = check_learner_memory(spec)
    assert plan is not None and plan.micro_batch_tokens == 40960
    assert 40 * GIB < plan.peak < 50 * GIB  # ≈ 45 GiB: 15 weights + 1.3 adapter states + 17 activations + ...
    assert fits(plan, setup())
    # Before: maxTokensPerStep (2M) was the micro-batch size: a 2M-token forward pass needs ~1 TB.
    before = plan_memory(QWEN3_8B, setup(micro_batch_tokens=2_000_000))
    assert before.peak > 900 * GIB
    # And without gradient checkpointing even one 64k sequence does not fit on one GPU.
    assert not fits(plan_memory(QWEN3_8B, setup(gradient_checkpointing=False)), setup())


def test_the_operator_refuses_a_spec_that_cannot_fit_with_the_numbers() -> None:
    learner = EXAMPLE["spec"]["learner"]
    with pytest.raises(LearnerMemoryError, match=r"needs about 9\d\d GiB per GPU, more than learner.gpuMemoryGib 80"):
        example_plan(learner=learner | {"microBatchTokens": 2_000_000})
    with pytest.raises(LearnerMemoryError, match=r"activations 219\.4 GiB"):
        example_plan(learner=learner | {"gradientCheckpointing": "off"})
    assert LearnerMemoryError.reason == "LearnerMemoryTooSmall"
    # auto turns checkpointing on exactly where the plan needs it.
    small = example_plan(engine=EXAMPLE["spec"]["engine"] | {"maxModelLen": 4096},
                         learner=learner | {"microBatchTokens": 4096})
    assert not small.learner.config.model.gradient_checkpointing
    assert example_plan().learner.config.model.gradient_checkpointing


def test_harnessrl_run_refuses_it_too_before_it_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harnessrl.local.run import main

    spec = EXAMPLE["spec"] | {"learner": EXAMPLE["spec"]["learner"] | {"microBatchTokens": 2_000_000}}
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump(EXAMPLE | {"spec": spec}))
    pools = sorted((ROOT / "examples" / "harnesspools").glob("*.yaml"))
    assert main([str(run), *map(str, pools), "--run-dir", str(tmp_path / "state"), "--no-live"]) == 2
    err = capsys.readouterr().err
    assert "harnessrl run: the learner needs about" in err and "activations 846.9 GiB (2000000 tokens)" in err
