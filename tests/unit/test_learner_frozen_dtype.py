"""What a single-process LoRA learner holds under bf16 compute, by dtype and bytes (on CPU: the same tensors a GPU
would hold): the frozen base in bf16 and the adapter in fp32, as the memory plan counts them, and a residual
stream in bf16. Before, the base stayed fp32 (twice the plan's bytes) and its fp32 norm weights made every
residual add fp32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from harnessrl.runtime.contracts.learner_config import AdapterConfig, ModelConfig
from harnessrl.runtime.learner.trainer import load_policy


def by_dtype(params: Any) -> dict[torch.dtype, int]:
    out: dict[torch.dtype, int] = {}
    for p in params:
        out[p.dtype] = out.get(p.dtype, 0) + p.numel() * p.element_size()
    return out


def test_the_frozen_base_and_the_residual_stream_are_bf16_and_the_adapter_fp32(tiny_model_dir: Path) -> None:
    cfg = ModelConfig(path=tiny_model_dir, served_name="tiny", dtype="bfloat16", device="cpu")
    model = load_policy(cfg, AdapterConfig(kind="lora", rank=4, alpha=8))
    frozen = [p for p in model.parameters() if not p.requires_grad]
    trainable = [p for p in model.parameters() if p.requires_grad]
    count = sum(p.numel() for p in frozen)
    assert by_dtype(frozen) == {torch.bfloat16: 2 * count}  # the plan's 2 bytes per frozen weight
    assert by_dtype(trainable) == {torch.float32: 4 * sum(p.numel() for p in trainable)}

    residual: list[torch.dtype] = []
    for layer in model.base_model.model.model.layers:
        layer.register_forward_hook(lambda _m, _i, out: residual.append((out[0] if isinstance(out, tuple) else out).dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=torch.tensor([[1, 2, 3, 4]]))
    assert residual and set(residual) == {torch.bfloat16}


def test_fp32_compute_keeps_everything_fp32(tiny_model_dir: Path) -> None:
    cfg = ModelConfig(path=tiny_model_dir, served_name="tiny", dtype="float32", device="cpu")
    model = load_policy(cfg, AdapterConfig(kind="lora", rank=4, alpha=8))
    assert set(by_dtype(model.parameters())) == {torch.float32}
