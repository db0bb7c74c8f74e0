"""The trainable policy and one GRPO step over packed micro-batches (torch + transformers + peft + TRL).

Per-token logprobs come from TRL's fused LM head (`add_fused_lm_head`): log p(token t+1 | ≤ t) without
materialising the (batch, length, vocab) logits, the same code path TRL's GRPO trainer uses.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from harnessrl.runtime.contracts.learner_config import AdapterConfig, GrpoConfig, ModelConfig
from harnessrl.runtime.learner.balance import balanced
from harnessrl.runtime.learner.distributed import World, all_max, all_sum, device_for, rank_share, shard
from harnessrl.runtime.learner.loss import (
    importance_weights,
    k3,
    loss_normalizer,
    per_sequence,
    reduce_loss,
    token_loss,
)
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
    base_kl: float = 0.0  # mean k3 KL to the base policy over loss tokens (with grpo.beta)
    # Loss tokens whose importance weight the band truncated, and those it masked (weight 0), per harness.
    is_truncated_by_harness: dict[str, int] = field(default_factory=dict)
    is_masked_by_harness: dict[str, int] = field(default_factory=dict)

    @classmethod
    def without_update(cls) -> StepStats:
        """A step that trained nothing (no group of it had reward variance)."""
        return cls(loss=0.0, clip_fraction=0.0, kl=0.0, loss_tokens=0, tokens=0, sequences=0, micro_batches=0,
                   grad_norm=0.0, seconds=0.0)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class MicroBatchStats:
    clipped: float  # loss tokens the clip cut
    kl: float  # Σ k3 KL to the engine's policy over loss tokens
    base_kl: float  # Σ k3 KL to the base policy over loss tokens (with grpo.beta)
    truncated: list[int]  # per sequence of the micro-batch (its sequence_ids' order): tokens truncated, masked
    masked: list[int]


def resolve_device(cfg: ModelConfig) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def compute_dtype(cfg: ModelConfig, device: torch.device) -> torch.dtype:
    """The precision of forward and backward; weights and optimizer state are always fp32 (master weights):
    in bf16 an update of lr 1e-5 on a weight of magnitude 1e-2 is below its rounding step and is lost."""
    if cfg.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]


def load_policy(
    model_cfg: ModelConfig, adapter: AdapterConfig, adapter_dir: Path | None = None, world: World = World(),
    temperature: float = 1.0,
) -> torch.nn.Module:
    """Base weights in fp32 (+ a LoRA adapter, fresh or from `adapter_dir`), prepared for training."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_cfg.path, dtype=torch.float32)
    return prepare_policy(model, model_cfg, adapter, adapter_dir, world, temperature)


def prepare_policy(
    model: torch.nn.Module,
    model_cfg: ModelConfig,
    adapter: AdapterConfig,
    adapter_dir: Path | None = None,
    world: World = World(),
    temperature: float = 1.0,
) -> torch.nn.Module:
    """An fp32 causal LM on its device with TRL's fused LM head (+ LoRA); in a world of several processes,
    sharded with FSDP2 (bf16 compute on GPUs). The head scores tokens at `temperature` (logits / temperature),
    the one the engine sampled at."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    device = device_for(world, resolve_device(model_cfg).type)
    model.to(device)
    add_fused_lm_head(model, temperature=temperature)  # before PEFT wraps it, as TRL requires
    if model_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if adapter.kind == "lora":
        if adapter_dir is not None:
            model = PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
        else:
            lora = LoraConfig(
                r=adapter.rank,
                lora_alpha=adapter.alpha,
                lora_dropout=adapter.dropout,
                target_modules=adapter.target_modules,
                task_type="CAUSAL_LM",
            )
            model = get_peft_model(model, lora)
    compute = compute_dtype(model_cfg, device)
    if world.distributed:
        shard(model, world, device.type, compute)
    elif compute != torch.float32:
        freeze_in(model, compute)
    return model


def freeze_in(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Frozen weights (a LoRA's base) in the compute dtype, as FSDP2 keeps them: they take no update, so no fp32
    master is needed, and autocast would cast them on every use anyway. Their norm weights in bf16 also keep the
    residual stream in bf16 (an fp32 norm weight times a bf16 activation is fp32, and so is every residual add
    after it): the memory plan counts 2 bytes per frozen weight and bf16 activations. Trainable weights stay
    fp32 (master weights)."""
    for param in model.parameters():
        if not param.requires_grad:
            param.data = param.data.to(dtype)


def idle_micro_batch(pad_id: int) -> MicroBatch:
    """A micro-batch that trains nothing. A rank with fewer micro-batches than another runs it, so that every
    rank makes the same FSDP collectives (all-gather in forward, reduce-scatter in backward)."""
    zeros = torch.zeros(1, 2)
    return MicroBatch(
        input_ids=torch.full((1, 2), pad_id, dtype=torch.long),
        attention_mask=torch.ones(1, 2, dtype=torch.long),
        loss_mask=zeros,
        behaviour_logps=zeros,
        advantages=torch.zeros(1),
        sequence_ids=[],
    )


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
    """One GRPO step. In a world of several processes every rank calls `step` with the same samples (rank 0's,
    broadcast) and trains on its share; gradients are summed across ranks, so the update equals one process's."""

    def __init__(
        self,
        model: torch.nn.Module,
        grpo: GrpoConfig,
        pad_id: int = 0,
        compute: torch.dtype = torch.float32,
        world: World = World(),
    ):
        self.model = model
        self.grpo = grpo
        self.pad_id = pad_id
        self.world = world
        self.device = next(model.parameters()).device
        # Sharded (FSDP2) models cast to the compute dtype themselves; a single process autocasts.
        self.autocast = compute != torch.float32 and not world.distributed
        self.compute = compute
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the policy has no trainable parameters")
        if any(p.dtype != torch.float32 for p in params):
            raise ValueError("trainable parameters must be fp32 (master weights); compute runs in the compute dtype")
        self.optimizer = torch.optim.AdamW(params, lr=grpo.lr, weight_decay=grpo.weight_decay)

    def _forward(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast:
            return torch.autocast(self.device.type, dtype=self.compute)
        return contextlib.nullcontext()

    def step(self, samples: list[Sample]) -> StepStats:
        t0 = time.perf_counter()
        samples = trainable(samples)
        if not samples:
            raise ValueError("no trainable tokens in this step's sequences")
        self.model.train()
        local = {"loss": 0.0, "clipped": 0.0, "kl": 0.0, "base_kl": 0.0, "loss_tokens": 0.0, "tokens": 0.0, "mbs": 0.0}
        grad_norm = 0.0
        # Each update takes at most maxTokensPerStep tokens (an over-long mini-batch becomes several updates);
        # the split is the same on every rank, and each rank then packs its share of each update.
        # Each update is balanced on its own (balance.py): its loss keeps the scale its loss type gives it.
        minis = [
            self._my_micro_batches(balanced(chunk, self.grpo.loss_balance, self.grpo.loss_type == "grpo"))
            for m in split_mini_batches(samples, self.grpo.mini_batches)
            for chunk in split_by_tokens(m, self.grpo.max_tokens_per_step)
        ]
        # With the correction, "old" is the trainer's policy before this step's first update. With one update
        # that is each micro-batch's own forward (detached, no extra pass); with several, scored once up front.
        correct = self.grpo.vllm_importance_sampling_correction
        old = [[self._score_no_grad(mb) for mb in mbs] for mbs, _, _ in minis] if correct and len(minis) > 1 else None
        harnesses = sorted({s.harness for s in samples})  # the same on every rank: samples are broadcast
        corrected = torch.zeros(2, len(harnesses), dtype=torch.float64)  # truncated, masked
        for k, (mbs, n_real, mine) in enumerate(minis):
            n_tokens, n_rows = all_sum(
                [sum(mb.loss_tokens for mb in mbs[:n_real]), sum(len(mb.sequence_ids) for mb in mbs[:n_real])],
                self.world,
            )
            normalizer = loss_normalizer(self.grpo, int(n_tokens), int(n_rows))
            self.optimizer.zero_grad(set_to_none=True)
            for j, mb in enumerate(mbs):
                loss, stats = self.micro_batch_loss(mb, normalizer, None if old is None else old[k][j])
                # FSDP averages gradients over ranks; each rank's loss is its share of the sum.
                (loss * self.world.size).backward()
                if j >= n_real:
                    continue
                local["loss"] += float(loss.detach())
                local["clipped"] += stats.clipped
                local["kl"] += stats.kl
                local["base_kl"] += stats.base_kl
                local["loss_tokens"] += mb.loss_tokens
                local["tokens"] += int(mb.attention_mask.sum())
                local["mbs"] += 1
                for sid, t, m in zip(mb.sequence_ids, stats.truncated, stats.masked, strict=True):
                    h = harnesses.index(mine[sid].harness)
                    corrected[0, h] += t
                    corrected[1, h] += m
            params = [p for p in self.model.parameters() if p.requires_grad]
            # With no clipping configured, an infinite bound still measures the norm for the metrics.
            limit = self.grpo.max_grad_norm if self.grpo.max_grad_norm is not None else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(params, limit)
            grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
            self.optimizer.step()
        totals = dict(zip(local, all_sum(list(local.values()), self.world), strict=True))
        by_harness = all_sum(corrected.flatten().tolist(), self.world)
        n = len(harnesses)
        lt = max(int(totals["loss_tokens"]), 1)
        return StepStats(
            loss=totals["loss"] / len(minis),
            clip_fraction=totals["clipped"] / lt,
            kl=totals["kl"] / lt,
            base_kl=totals["base_kl"] / lt,
            loss_tokens=int(totals["loss_tokens"]),
            tokens=int(totals["tokens"]),
            sequences=len(samples),
            micro_batches=int(totals["mbs"]),
            grad_norm=grad_norm if math.isfinite(grad_norm) else float("nan"),
            seconds=time.perf_counter() - t0,
            is_truncated_by_harness={h: int(v) for h, v in zip(harnesses, by_harness[:n], strict=True) if v},
            is_masked_by_harness={h: int(v) for h, v in zip(harnesses, by_harness[n:], strict=True) if v},
        )

    def _my_micro_batches(self, mini: list[Sample]) -> tuple[list[MicroBatch], int, list[Sample]]:
        """This rank's share of a mini-batch, packed, then topped up with idle micro-batches to the most any
        rank has; how many of them are real; and the share (what the micro-batches' sequence ids index)."""
        mine = rank_share(mini, [len(s.sequence.token_ids) for s in mini], self.world)
        mbs = self._pack(mine) if mine else []
        n = all_max(len(mbs), self.world)
        return mbs + [idle_micro_batch(self.pad_id) for _ in range(n - len(mbs))], len(mbs), mine

    def _pack(self, samples: list[Sample]) -> list[MicroBatch]:
        if self.grpo.padding_free:
            return pack_flat(samples, self.grpo.micro_batch_tokens)
        return pack(samples, self.grpo.micro_batch_tokens, self.pad_id)

    @torch.no_grad()
    def _base_logps(self, mb: MicroBatch) -> torch.Tensor:
        """The base policy's logprobs: the LoRA adapter switched off (peft's `disable_adapter`)."""
        with self.model.disable_adapter(), self._forward():
            return sequence_logps(self.model, mb)

    @torch.no_grad()
    def _score_no_grad(self, mb: MicroBatch) -> torch.Tensor:
        with self._forward():
            return sequence_logps(self.model, mb).cpu()

    def micro_batch_loss(
        self, mb: MicroBatch, normalizer: float, proximal: torch.Tensor | None
    ) -> tuple[torch.Tensor, MicroBatchStats]:
        """The micro-batch's share of the update's loss. `proximal`: the trainer's logprobs before the step's
        first update (None: this forward's own, right for the step's only update)."""
        with self._forward():
            logps = sequence_logps(self.model, mb)
        dev = logps.device
        mask = mb.loss_mask.to(dev)
        engine = mb.behaviour_logps.to(dev)
        segments = None if mb.segments is None else mb.segments.to(dev)
        old, weights = engine, None
        if self.grpo.vllm_importance_sampling_correction:
            old = logps.detach() if proximal is None else proximal.to(dev)
            weights = importance_weights(old, engine, mask, self.grpo, segments)
        base = self._base_logps(mb).to(dev) if self.grpo.beta > 0 else None
        tl = token_loss(logps, old, mb.advantages.to(dev), mask, self.grpo,
                        None if weights is None else weights.weights, segments, base)
        loss = reduce_loss(tl.per_token, mask, self.grpo.loss_type, normalizer, segments)

        def count(flags: torch.Tensor) -> list[int]:
            return [int(v) for v in per_sequence(flags.float() * mask, segments).tolist()][: len(mb.sequence_ids)]

        none = [0] * len(mb.sequence_ids)
        return loss, MicroBatchStats(
            clipped=float((tl.clipped.float() * mask).sum()),
            kl=float((k3(logps.detach() - engine) * mask).sum()),
            base_kl=0.0 if tl.base_kl is None else float((tl.base_kl * mask).sum()),
            truncated=none if weights is None else count(weights.truncated),
            masked=none if weights is None else count(weights.masked),
        )

    # -- state for checkpoints ------------------------------------------------------------------------------
    # Full (unsharded) state keyed by parameter name, so a checkpoint written by N processes resumes in M.
    # Gathering is collective: every rank calls these; rank 0 writes what they return. What they return is
    # rank 0's own copy: a checkpoint is written while the next step changes the live weights.

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The trainable weights, whole (for LoRA the adapter only: the frozen base is never gathered)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        state: dict[str, torch.Tensor] = self._unaliased(get_model_state_dict(self.model, options=options))
        return state

    def optimizer_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        state: dict[str, Any] = self._unaliased(
            get_optimizer_state_dict(self.model, self.optimizer, options=self._full_state()))
        return state

    def _unaliased(self, tree: Any) -> Any:
        """`tree` with a copy of each tensor that is live training state. Only one process on the CPU returns
        those as they are (`cpu_offload` moves nothing already there); gathered or offloaded ones are copies."""
        if self.world.distributed:
            return tree
        live = {t.data_ptr() for t in (*self.model.parameters(), *self.model.buffers())}
        live |= {t.data_ptr() for s in self.optimizer.state.values() for t in s.values() if torch.is_tensor(t)}
        return _copy_tensors(tree, live, {})

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state, options=self._full_state())

    def _full_state(self) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, cpu_offload=True)


def _copy_tensors(tree: Any, data_ptrs: set[int], copies: dict[tuple[Any, ...], torch.Tensor]) -> Any:
    """`tree` (dicts and lists of tensors and plain values) with the tensors at `data_ptrs` cloned, each once: tied
    weights stay one tensor in the copy, as `save_pretrained` expects them."""
    if torch.is_tensor(tree):
        if tree.data_ptr() not in data_ptrs:
            return tree
        key = (tree.data_ptr(), tree.dtype, tuple(tree.shape), tree.stride())
        if key not in copies:
            copies[key] = tree.clone()
        return copies[key]
    if isinstance(tree, dict):
        return {k: _copy_tensors(v, data_ptrs, copies) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_copy_tensors(v, data_ptrs, copies) for v in tree]
    return tree
