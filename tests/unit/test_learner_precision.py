"""Full fine-tuning keeps fp32 master weights under bf16 compute: an update of lr 1e-5 is not rounded away.

In bf16 the rounding step of a weight of magnitude ~0.02 is ~1e-4, ten times AdamW's first update (~lr): pure
bf16 parameters would keep nearly every weight where it was. The reference is the same step fully in fp32.
"""

from __future__ import annotations

from pathlib import Path

import torch
from harnessrl.runtime.contracts.learner_config import AdapterConfig, GrpoConfig, ModelConfig
from harnessrl.runtime.learner.packing import Sample
from harnessrl.runtime.learner.trainer import PolicyTrainer, compute_dtype, load_policy
from harnessrl.runtime.trajectory.models import TrainingSequence

LR = 1e-5


def samples(vocab: int) -> list[Sample]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(4):
        ids = torch.randint(1, vocab, (12 + i,), generator=g).tolist()
        n = len(ids)
        seq = TrainingSequence(session_id=f"s{i}", node_ids=[0], token_ids=ids, loss_mask=[0] * 6 + [1] * (n - 6),
                               logprobs=[0.0] * 6 + [-4.0] * (n - 6), policy_versions=[0] * n)
        out.append(Sample(sequence=seq, advantage=[1.0, -1.0, 0.5, -0.5][i]))
    return out


def one_step(path: Path, dtype: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    cfg = ModelConfig(path=path, served_name="tiny", dtype=dtype, device="cpu")
    model = load_policy(cfg, AdapterConfig(kind="full"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grpo = GrpoConfig(lr=LR, max_grad_norm=None)
    trainer = PolicyTrainer(model, grpo, compute=compute_dtype(cfg, torch.device("cpu")))
    trainer.step(samples(model.config.vocab_size))
    return before, {n: p.detach().clone() for n, p in model.named_parameters()}


def test_full_fine_tune_in_bf16_compute_moves_weights_like_fp32(tiny_model_dir: Path) -> None:
    start, bf16 = one_step(tiny_model_dir, "bfloat16")
    _, fp32 = one_step(tiny_model_dir, "float32")
    moved = sum(int((bf16[n] != start[n]).sum()) for n in start)
    total = sum(p.numel() for p in start.values())
    assert moved / total > 0.9, f"only {moved}/{total} weights moved at lr {LR}"
    assert all(p.dtype == torch.float32 for p in bf16.values()), "master weights must stay fp32"
    # AdamW's first update is ~lr·sign(grad): bf16 gradients give the fp32 step except where a gradient is
    # near zero and its sign differs.
    step_bf16 = torch.cat([(bf16[n] - start[n]).flatten() for n in start])
    step_fp32 = torch.cat([(fp32[n] - start[n]).flatten() for n in start])
    close = (step_bf16 - step_fp32).abs() <= 1e-7 + 0.02 * step_fp32.abs()
    assert float(close.float().mean()) > 0.95, float(close.float().mean())
    assert float((step_bf16 - step_fp32).abs().max()) <= 2.2 * LR
