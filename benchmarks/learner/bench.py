"""Learner step throughput on one GPU: tokens/s, MFU and peak memory of the learner's own GRPO step
(runtime/learner/trainer.py: fp32 master weights, bf16 autocast, TRL's fused LM head, gradient checkpointing),
for LoRA and full fine-tuning of a random-initialised Qwen3-1.7B-, 4B- or 8B-shaped model at 16k and 32k tokens
per sequence. No network, no downloads.

    python benchmarks/learner/bench.py --shape 1.7b --out results.json    # one H100 or H200: a few minutes
    python benchmarks/learner/bench.py --tiny --out tiny.json             # CPU, a tiny shape (make test)

Where harnessrl (and TRL, which its step uses) is not installed, the script times a standalone step with
torch, transformers and peft alone (same precision, checkpointing and clipped loss; log-probabilities from
checkpointed chunks of the LM head instead of TRL's fused head); the report's `step` says which ran.

MFU = model FLOPs / (seconds × peak), peak = 989.4 TFLOP/s: H100 and H200 SXM, dense bf16 (the 1,979 of the
data sheets is with 2:4 sparsity). Model FLOPs per token count the matmuls of the linear layers (N of them,
embeddings excluded, the LM head included) and causal attention, A = 2·L·T·(heads·head_dim) at context T, whose
backward is twice its forward (dQ, dK, dV, dP) and has no weights. A full fine-tune's step = 3 × (2·N + A)
(forward, input and weight gradients); a LoRA step = 2 × 2·N + 3 × A (frozen weights get no weight gradient,
attention's backward is the same as a full fine-tune's; the adapters' own FLOPs are left out). Recomputation
by gradient checkpointing is not counted (hardware FLOPs exceed model FLOPs).

The headline case (HEADLINE) must fit an 80 GB H100 by the operator's own memory plan (runtime/contracts/learner_memory.py):
a 4B full fine-tune plans ~87 GiB, so the headline is the 1.7B shape (~43 GiB at 16k tokens).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

PEAK_FLOPS = 989.4e12  # H100 and H200 SXM, dense bf16
HEADLINE = ("1.7b", "full", 16384)  # shape, adapter, tokens: the case the MFU target is for
LORA_RANK = 16  # the learner's default (AdapterConfig.rank)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # the learner's default
HEAD_CHUNK = 4096  # tokens per LM-head chunk in the standalone step

# Qwen3-4B and Qwen3-8B as published (config.json), weights random.
SHAPES: dict[str, dict[str, Any]] = {
    "1.7b": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True},
    "4b": {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True},
    "8b": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256, "tie_word_embeddings": True},
}


@dataclass
class Case:
    step: str  # "learner" (runtime/learner/trainer.py) or "standalone"
    shape: str
    adapter: str
    seq_len: int
    steps: int
    tokens: int
    seconds: float
    tokens_per_s: float
    model_flops: float
    mfu: float
    peak_memory_bytes: int
    grad_norm: float
    planned_peak_bytes: int | None = None  # the operator's memory plan for this case; None: harnessrl not importable
    error: str | None = None


def qwen3_config(shape: str, seq_len: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(**SHAPES[shape], max_position_embeddings=max(seq_len, 40960), rope_theta=1_000_000.0)


def linear_params(config: Any) -> int:
    """Weights of the matmuls one token goes through (attention and MLP projections, the LM head)."""
    d, f, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * f
    return L * per_layer + d * config.vocab_size


def step_flops(config: Any, seq_len: int, sequences: int, adapter: str) -> float:
    """Model FLOPs of one training step on `sequences` sequences of `seq_len` tokens (see the module doc)."""
    attention = 2 * config.num_hidden_layers * seq_len * config.num_attention_heads * config.head_dim
    linear = 2 * linear_params(config)
    # Attention: forward + a backward of twice it, LoRA or not; linears: forward, input gradient, and (full) weights.
    return ((3 if adapter == "full" else 2) * linear + 3 * attention) * seq_len * sequences


def random_batch(seq_len: int, vocab: int, seed: int) -> dict[str, Any]:
    """One sequence: a prompt (half), then sampled tokens with engine logprobs, and an advantage."""
    g = torch.Generator().manual_seed(seed)
    prompt = seq_len // 2
    return {"ids": torch.randint(0, vocab, (seq_len,), generator=g).tolist(), "prompt": prompt,
            # Near a random-initialised model's own -ln(vocab), so ratios stay inside the clip and every step trains.
            "logps": (-math.log(vocab) + (torch.rand(seq_len - prompt, generator=g) - 0.5) * 0.1).tolist(),
            "advantage": 1.0 if seed % 2 else -1.0}


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # CPU: the process's peak resident set (Linux reports KiB).
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def planned_peak(shape: str, adapter: str, seq_len: int) -> int | None:
    """Peak bytes per GPU that the operator's memory plan (runtime/contracts/learner_memory.py) gives this case: what the
    measured peak calibrates. None where harnessrl is not importable (the standalone machine)."""
    try:
        from harnessrl.runtime.contracts.learner_memory import ModelShape, TrainingSetup, plan_memory
    except ImportError:
        return None
    model = ModelShape(**{k: v for k, v in SHAPES[shape].items() if k in ModelShape.model_fields})
    setup = TrainingSetup(lora_rank=LORA_RANK if adapter == "lora" else None, lora_targets=LORA_TARGETS,
                          micro_batch_tokens=seq_len, max_sequence_tokens=seq_len, gradient_checkpointing=True,
                          gpus=1, gpu_memory_bytes=1)
    return plan_memory(model, setup).peak


def learner_step(model: torch.nn.Module, adapter: str, seq_len: int, device: torch.device) -> Callable[[dict[str, Any]], tuple[int, float]]:
    """The learner's own step (PolicyTrainer) on the learner's own model preparation."""
    from harnessrl.runtime.contracts.learner_config import AdapterConfig, GrpoConfig, ModelConfig
    from harnessrl.runtime.learner.packing import Sample
    from harnessrl.runtime.learner.trainer import PolicyTrainer, compute_dtype, prepare_policy
    from harnessrl.runtime.trajectory.models import TrainingSequence

    model_cfg = ModelConfig(path=Path("."), served_name="bench", device=device.type, gradient_checkpointing=True)
    model = prepare_policy(model, model_cfg, AdapterConfig(kind=adapter, rank=LORA_RANK, target_modules=LORA_TARGETS))
    # One sequence per micro-batch, as the learner packs a long sequence.
    trainer = PolicyTrainer(model, GrpoConfig(micro_batch_tokens=seq_len), compute=compute_dtype(model_cfg, device))

    def step(b: dict[str, Any]) -> tuple[int, float]:
        n, p = len(b["ids"]), b["prompt"]
        seq = TrainingSequence(session_id="bench", node_ids=[0], token_ids=b["ids"], loss_mask=[0] * p + [1] * (n - p),
                               logprobs=[0.0] * p + b["logps"], policy_versions=[0] * n)
        stats = trainer.step([Sample(sequence=seq, advantage=b["advantage"])])
        return stats.tokens, stats.grad_norm

    return step


def standalone_step(model: torch.nn.Module, adapter: str, device: torch.device) -> Callable[[dict[str, Any]], tuple[int, float]]:
    """The learner's step rebuilt from torch, transformers and peft alone (for a machine without harnessrl)."""
    from torch.utils.checkpoint import checkpoint

    model.to(device)
    model.gradient_checkpointing_enable()
    if adapter == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"))
        model.enable_input_require_grads()
    base = model.get_base_model() if adapter == "lora" else model
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def chunk_logps(hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = base.lm_head(hidden).float()
        return torch.gather(logits.log_softmax(-1), -1, targets.unsqueeze(-1)).squeeze(-1)

    def step(b: dict[str, Any]) -> tuple[int, float]:
        ids = torch.tensor([b["ids"]], device=device)
        p = b["prompt"]
        with autocast:
            hidden = base.model(input_ids=ids).last_hidden_state[:, p - 1 : -1]
            targets = ids[:, p:]
            logps = torch.cat([checkpoint(chunk_logps, hidden[:, i : i + HEAD_CHUNK], targets[:, i : i + HEAD_CHUNK],
                                          use_reentrant=False) for i in range(0, targets.size(1), HEAD_CHUNK)], dim=1)
        # The learner's default loss at one update per step: the clip is taken against its own pre-step logprobs
        # (a ratio of 1 that carries the gradient) and each token is weighted by π_pre-step/π_engine, capped at 3.
        ratio = torch.exp(logps - logps.detach())
        weights = torch.clamp(torch.exp(logps.detach() - torch.tensor([b["logps"]], device=device)), max=3.0)
        adv = b["advantage"]
        loss = -(torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.28) * adv) * weights).mean()
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return ids.numel(), norm

    return step


def run_case(shape: str, adapter: str, seq_len: int, steps: int, device: torch.device, standalone: bool) -> Case:
    from transformers import AutoModelForCausalLM

    config = qwen3_config(shape, seq_len)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # fp32 master weights
    step = standalone_step(model, adapter, device) if standalone else learner_step(model, adapter, seq_len, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step(random_batch(seq_len, config.vocab_size, seed=0))  # warm-up: allocator, kernels
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    tokens, grad_norm = 0, 0.0
    for k in range(steps):
        n, grad_norm = step(random_batch(seq_len, config.vocab_size, seed=k + 1))
        tokens += n
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    flops = step_flops(config, seq_len, 1, adapter) * steps
    return Case(step="standalone" if standalone else "learner", shape=shape, adapter=adapter, seq_len=seq_len,
                steps=steps, tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds, model_flops=flops,
                mfu=flops / seconds / PEAK_FLOPS, peak_memory_bytes=peak_memory(device), grad_norm=grad_norm,
                planned_peak_bytes=planned_peak(shape, adapter, seq_len))


def gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def learner_available() -> bool:
    try:
        import harnessrl.runtime.learner.trainer  # noqa: F401
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=["1.7b", "4b", "8b"], default=HEADLINE[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny shape on CPU at 64/128 tokens (a smoke run)")
    parser.add_argument("--adapters", default="full,lora")
    parser.add_argument("--seq-lens", default=None, help="comma-separated; default 16384,32768 (tiny: 64,128)")
    parser.add_argument("--steps", type=int, default=2, help="measured steps per case, after one warm-up step")
    parser.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    parser.add_argument("--standalone", action="store_true", help="time the standalone step even if harnessrl is installed")
    args = parser.parse_args(argv)
    standalone = args.standalone or not learner_available()
    shape = "tiny" if args.tiny else args.shape
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    lens = [int(x) for x in (args.seq_lens or ("64,128" if args.tiny else "16384,32768")).split(",")]
    cases = []
    for adapter in args.adapters.split(","):
        for seq_len in lens:
            try:
                case = run_case(shape, adapter, seq_len, args.steps, device, standalone)
            except torch.cuda.OutOfMemoryError as exc:
                config = qwen3_config(shape, seq_len)
                case = Case("standalone" if standalone else "learner", shape, adapter, seq_len, 0, 0, 0.0, 0.0,
                            step_flops(config, seq_len, 1, adapter), 0.0, peak_memory(device), 0.0,
                            planned_peak(shape, adapter, seq_len), error=f"out of memory: {str(exc)[:200]}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
            cases.append(case)
            print(f"{shape} {adapter:4} {seq_len:>6} tok: {case.tokens_per_s:10.1f} tok/s  MFU {case.mfu:6.1%}  "
                  f"peak {case.peak_memory_bytes / 2**30:7.2f} GiB (plan {gib(case.planned_peak_bytes)})" + (f"  {case.error}" if case.error else ""),
                  flush=True)
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "peak_flops": PEAK_FLOPS,
        "linear_params": linear_params(qwen3_config(shape, max(lens))),
        "cases": [asdict(c) for c in cases],
    }
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
