"""The trainable policy and one GRPO step over packed micro-batches (torch + transformers + peft + TRL).

Per-token logprobs come from TRL's fused LM head (`add_fused_lm_head`): log p(token t+1 | ≤ t) without
materialising the (batch, length, vocab) logits, the same code path TRL's GRPO trainer uses.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from harnessrl.runtime.learner.config import AdapterConfig, GrpoConfig, ModelConfig
from harnessrl.runtime.learner.loss import loss_normalizer, reduce_loss, tis_weights, token_loss
from harnessrl.runtime.learner.packing import (
    MicroBatch,
    Sample,
    pack,
    pack_flat,
    split_by_tokens,
    split_mini_batches,
    trainable,
)

log = logging.getLogger(__name__)


@dataclass
class StepStats:
    loss: float
    clip_fraction: float
    kl: float
    loss_tokens: int
    tokens: int
    sequences: int
    micro_batches: int
    grad_norm: float
    seconds: float

    @classmethod
    def without_update(cls) -> StepStats:
        """A step that trained nothing (no group of it had reward variance)."""
        return cls(loss=0.0, clip_fraction=0.0, kl=0.0, loss_tokens=0, tokens=0, sequences=0, micro_batches=0,
                   grad_norm=0.0, seconds=0.0)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def resolve_device(cfg: ModelConfig) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def resolve_dtype(cfg: ModelConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]


def load_policy(model_cfg: ModelConfig, adapter: AdapterConfig, adapter_dir: Path | None = None) -> torch.nn.Module:
    """Base weights (+ a LoRA adapter, fresh or from `adapter_dir`) with TRL's fused LM head added."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    device = resolve_device(model_cfg)
    model = AutoModelForCausalLM.from_pretrained(model_cfg.path, dtype=resolve_dtype(model_cfg, device))
    model.to(device)
    add_fused_lm_head(model)  # before PEFT wraps it, as TRL requires
    if model_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if adapter.kind == "lora":
        if adapter_dir is not None:
            return PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
        lora = LoraConfig(
            r=adapter.rank,
            lora_alpha=adapter.alpha,
            lora_dropout=adapter.dropout,
            target_modules=adapter.target_modules,
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, lora)
    return model


def sequence_logps(model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
    """(B, T) logprob of each token given the ones before it; column 0 (never predicted) is 0."""
    device = next(model.parameters()).device
    input_ids = mb.input_ids.to(device)
    # Only sampled tokens need scoring; -100 lets the fused head skip the rest on GPU.
    labels = input_ids.masked_fill(mb.loss_mask.to(device) == 0, -100)
    if mb.position_ids is not None:  # padding-free: no attention mask, positions mark where sequences start
        out = model(input_ids=input_ids, position_ids=mb.position_ids.to(device), labels=labels, fused_lm_head=True)
    else:
        out = model(input_ids=input_ids, attention_mask=mb.attention_mask.to(device), labels=labels,
                    fused_lm_head=True)
    lp = out.log_probs.float()
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)


class PolicyTrainer:
    def __init__(self, model: torch.nn.Module, grpo: GrpoConfig, pad_id: int = 0):
        self.model = model
        self.grpo = grpo
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the policy has no trainable parameters")
        self.optimizer = torch.optim.AdamW(params, lr=grpo.lr, weight_decay=grpo.weight_decay)

    def step(self, samples: list[Sample]) -> StepStats:
        t0 = time.perf_counter()
        samples = trainable(samples)
        if not samples:
            raise ValueError("no trainable tokens in this step's sequences")
        self.model.train()
        totals = {"loss": 0.0, "clipped": 0.0, "kl": 0.0, "loss_tokens": 0, "tokens": 0, "mbs": 0}
        grad_norm = 0.0
        minis = [
            (pack_flat(chunk, self.grpo.micro_batch_tokens) if self.grpo.padding_free
             else pack(chunk, self.grpo.micro_batch_tokens, self.pad_id))
            for m in split_mini_batches(samples, self.grpo.mini_batches)
            for chunk in split_by_tokens(m, self.grpo.max_tokens_per_step)
        ]
        # With TIS, "old" is the trainer's policy before this step's first update, scored once up front.
        old = [[self._score_no_grad(mb) for mb in mbs] for mbs in minis] if self.grpo.tis_cap is not None else None
        for k, mbs in enumerate(minis):
            n_tokens = sum(mb.loss_tokens for mb in mbs)
            n_rows = sum(len(mb.sequence_ids) for mb in mbs)
            normalizer = loss_normalizer(self.grpo, n_tokens, n_rows)
            self.optimizer.zero_grad(set_to_none=True)
            for j, mb in enumerate(mbs):
                loss, stats = self.micro_batch_loss(mb, normalizer, None if old is None else old[k][j])
                loss.backward()
                totals["loss"] += float(loss.detach())
                totals["clipped"] += stats["clipped"]
                totals["kl"] += stats["kl"]
                totals["loss_tokens"] += mb.loss_tokens
                totals["tokens"] += int(mb.attention_mask.sum())
                totals["mbs"] += 1
            params = [p for p in self.model.parameters() if p.requires_grad]
            # With no clipping configured, an infinite bound still measures the norm for the metrics.
            limit = self.grpo.max_grad_norm if self.grpo.max_grad_norm is not None else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, limit))
            self.optimizer.step()
        lt = max(int(totals["loss_tokens"]), 1)
        return StepStats(
            loss=totals["loss"] / len(minis),
            clip_fraction=totals["clipped"] / lt,
            kl=totals["kl"] / lt,
            loss_tokens=int(totals["loss_tokens"]),
            tokens=int(totals["tokens"]),
            sequences=len(samples),
            micro_batches=int(totals["mbs"]),
            grad_norm=grad_norm if math.isfinite(grad_norm) else float("nan"),
            seconds=time.perf_counter() - t0,
        )

    @torch.no_grad()
    def _score_no_grad(self, mb: MicroBatch) -> torch.Tensor:
        return sequence_logps(self.model, mb).cpu()

    def micro_batch_loss(
        self, mb: MicroBatch, normalizer: float, trainer_old: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        logps = sequence_logps(self.model, mb)
        dev = logps.device
        mask = mb.loss_mask.to(dev)
        engine = mb.behaviour_logps.to(dev)
        if trainer_old is None:
            old, weights = engine, None
        else:
            assert self.grpo.tis_cap is not None
            old = trainer_old.to(dev)
            weights = tis_weights(old, engine, self.grpo.tis_cap)
        tl = token_loss(logps, old, mb.advantages.to(dev), self.grpo.clip_low, self.grpo.clip_high, weights)
        loss = reduce_loss(tl.per_token, mask, self.grpo.loss_type, normalizer, mb.segments)
        stats = {
            "clipped": float((tl.clipped.float() * mask).sum()),
            "kl": float((tl.kl * mask).sum()),
        }
        return loss, stats

    # -- state for checkpoints ------------------------------------------------------------------------------

    def optimizer_state(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)
