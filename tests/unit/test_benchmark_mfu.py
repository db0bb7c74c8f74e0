"""The arithmetic of benchmarks/learner's MFU: the peak it divides by, the FLOPs of a step counted by torch's own
FlopCounterMode on a real forward and backward, and a headline case that fits an 80 GB GPU by the operator's own
memory plan."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from harnessrl.runtime.contracts.learner_memory import GIB, ModelShape, TrainingSetup, fits, plan_memory
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "learner"))
import bench

SEQ = 48


def test_the_peak_is_h100_and_h200_sxm_dense_bf16() -> None:
    # NVIDIA's data sheets: 1,979 TFLOP/s bf16 with 2:4 sparsity, 989.4 dense; the same on H100 and H200 SXM.
    assert bench.PEAK_FLOPS == 989.4e12
    # The 790 it divided by before read every MFU 1.25 times high.
    ratio = bench.PEAK_FLOPS / 790e12
    assert ratio == pytest.approx(1.25, abs=0.003)


def counted(model: Any, ids: torch.Tensor) -> tuple[dict[str, int], dict[str, int]]:
    """(forward, backward) FLOPs by aten op, as FlopCounterMode counts them."""
    def by_op(counter: FlopCounterMode) -> dict[str, int]:
        return {str(op).split(".")[-1]: n for op, n in counter.get_flop_counts()["Global"].items()}

    with FlopCounterMode(display=False) as fwd:
        loss = model(input_ids=ids).logits.float().logsumexp(-1).mean()
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    return by_op(fwd), by_op(bwd)


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_step_flops_are_what_torch_counts_in_a_real_step(adapter: str) -> None:
    from transformers import AutoModelForCausalLM

    config = bench.qwen3_config("tiny", SEQ)
    config._attn_implementation = "eager"  # attention as two batched matmuls FlopCounterMode sees (sdpa: one op)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if adapter == "lora":
        # The frozen base of a LoRA step: no weight gradients, input gradients through every layer (the adapters'
        # own FLOPs are left out of the model FLOPs, so none are added here).
        model.requires_grad_(False)
        model.enable_input_require_grads()
    fwd, bwd = counted(model, torch.randint(0, config.vocab_size, (1, SEQ)))
    linear_fwd = fwd.get("mm", 0) + fwd.get("addmm", 0)
    assert linear_fwd == 2 * bench.linear_params(config) * SEQ  # the linear layers and the LM head
    # Attention's backward is twice its forward, LoRA or not (it has no weights); linears' is 1× or 2×.
    assert bwd["bmm"] == 2 * fwd["bmm"]
    assert bwd.get("mm", 0) + bwd.get("addmm", 0) == linear_fwd * (2 if adapter == "full" else 1)
    # Eager attention computes the whole T×T square; causal attention's model FLOPs are half of it.
    measured = sum(fwd.values()) + sum(bwd.values()) - (fwd["bmm"] + bwd["bmm"]) // 2
    assert bench.step_flops(config, SEQ, 1, adapter) == measured


def test_the_headline_case_fits_an_80_gb_gpu_by_the_operators_memory_plan() -> None:
    shape, adapter, tokens = bench.HEADLINE

    def plan(shape: str) -> tuple[Any, TrainingSetup]:
        setup = TrainingSetup(lora_rank=None if adapter == "full" else 16, micro_batch_tokens=tokens,
                              max_sequence_tokens=tokens, gradient_checkpointing=True, gpus=1, gpu_memory_bytes=80 * GIB)
        return plan_memory(ModelShape.from_config(bench.SHAPES[shape]), setup), setup

    headline, setup = plan(shape)
    assert fits(headline, setup), headline.summary()
    # The 4B full fine-tune it replaced plans more than an H100 has.
    four_b, _ = plan("4b")
    assert not fits(four_b, setup) and four_b.peak > 85 * GIB
