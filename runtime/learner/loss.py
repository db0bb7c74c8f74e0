"""The GRPO/DAPO/CISPO token loss and its off-policy correction. Pure torch: tensors in, per-token loss out.

Same arithmetic as TRL's `GRPOTrainer._compute_loss` (token- or sequence-level ratio (GSPO), two-sided clip with
separate low/high epsilons or CISPO's clipped weight, vLLM importance-sampling weights bounded by truncation or
masking), with one difference in where rollouts come from: asynchronously, from an engine that may be several
versions behind. The engine's logprob recorded with each sampled token is that token's behaviour policy. With
the correction on, the trainer's own logprobs at the start of the step are the proximal "old" policy the clip is
taken against, and exp(proximal − engine), bounded, weights each token: a stale rollout is corrected, not dropped.

A row is one sequence (padded micro-batches) or several concatenated ones (`segments` says which token belongs
to which); `per_sequence` and `broadcast` make sequence-level quantities work on both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from harnessrl.runtime.contracts.learner_config import GrpoConfig


def per_sequence(x: torch.Tensor, segments: torch.Tensor | None) -> torch.Tensor:
    """(B, T) → one sum per sequence: (B,) for padded rows, (n,) over the segments of a padding-free row."""
    if segments is None:
        return x.sum(-1)
    n = int(segments.max()) + 1
    return torch.zeros(n, dtype=x.dtype, device=x.device).scatter_add(0, segments.flatten(), x.flatten())


def broadcast(values: torch.Tensor, segments: torch.Tensor | None) -> torch.Tensor:
    """One value per sequence → every token of it ((B, 1) for padded rows, (1, T) for a padding-free row)."""
    return values.unsqueeze(-1) if segments is None else values[segments]


@dataclass
class TokenLoss:
    per_token: torch.Tensor  # (B, T) loss before masking/normalisation
    clipped: torch.Tensor  # (B, T) bool: the clip (or CISPO's cap) cut this token's ratio on the side that matters
    base_kl: torch.Tensor | None = None  # (B, T) detached k3 KL to the base policy, with a KL penalty


@dataclass
class IsWeights:
    weights: torch.Tensor  # (B, T) detached: bounded π_proximal / π_engine
    truncated: torch.Tensor  # (B, T) bool: loss tokens whose ratio was truncated into the band
    masked: torch.Tensor  # (B, T) bool: loss tokens whose weight the band set to 0


def token_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    grpo: GrpoConfig,
    is_weights: torch.Tensor | None = None,
    segments: torch.Tensor | None = None,
    base_logps: torch.Tensor | None = None,
) -> TokenLoss:
    """logps/old_logps/mask: (B, T); advantages: (B,) or (B, T); is_weights: (B, T) or None; base_logps: (B, T),
    the base policy's, for the KL penalty (grpo.beta)."""
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    log_ratio = logps - old_logps
    if grpo.importance_sampling_level == "sequence":  # GSPO: the mean log-ratio of the sequence's loss tokens
        log_ratio = broadcast(per_sequence(log_ratio * mask, segments) / per_sequence(mask, segments).clamp(min=1.0),
                              segments)
    coef_1 = torch.exp(log_ratio)
    if grpo.loss_type == "cispo":
        per_token = -torch.clamp(coef_1, max=grpo.clip_high).detach() * adv * logps
        clipped = (coef_1 > grpo.clip_high) & (adv > 0)
    else:
        coef_2 = torch.clamp(coef_1, 1 - grpo.clip_low, 1 + grpo.clip_high)
        per_token = -torch.min(coef_1 * adv, coef_2 * adv)
        clipped = ((coef_1 < 1 - grpo.clip_low) & (adv < 0)) | ((coef_1 > 1 + grpo.clip_high) & (adv > 0))
    if is_weights is not None:
        per_token = per_token * is_weights
    base_kl = None
    if base_logps is not None and grpo.beta > 0:
        d = base_logps - logps
        kl = torch.exp(d) - d - 1
        base_kl = kl.detach()
        per_token = per_token + grpo.beta * (kl * coef_1 if grpo.use_bias_correction_kl else kl)
    return TokenLoss(per_token=per_token, clipped=clipped.detach().expand_as(mask), base_kl=base_kl)


def importance_weights(proximal: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, grpo: GrpoConfig,
                       segments: torch.Tensor | None = None) -> IsWeights:
    """π_proximal / π_engine per token (or its product over the sequence), truncated into or masked outside
    [clip_min, clip_max] (TRL's vllm_importance_sampling_mode). A band of masking is IcePop's: tokens whose
    engine and trainer disagree too much carry no gradient, instead of a gradient capped at the band's edge."""
    diff = torch.nan_to_num((proximal - engine) * mask, nan=0.0)
    mode = grpo.vllm_importance_sampling_mode
    if mode.startswith("sequence"):
        diff = broadcast(per_sequence(diff, segments), segments).expand_as(mask)
    ratio = torch.exp(diff)
    lo, hi = grpo.vllm_importance_sampling_clip_min, grpo.vllm_importance_sampling_clip_max
    outside = ((ratio < (lo if lo is not None else -math.inf)) | (ratio > (hi if hi is not None else math.inf)))
    outside = outside & (mask > 0)
    if mode.endswith("truncate"):
        weights, truncated, masked = torch.clamp(ratio, min=lo, max=hi), outside, torch.zeros_like(outside)
    else:
        weights, truncated, masked = ratio.masked_fill(outside, 0.0), torch.zeros_like(outside), outside
    return IsWeights(weights=weights.detach(), truncated=truncated, masked=masked)


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL per token from log π − log π_behaviour (for the metrics)."""
    return (torch.exp(log_ratio) - 1 - log_ratio).detach()


def loss_normalizer(grpo: GrpoConfig, loss_tokens: int, rows: int) -> float:
    """What the whole mini-batch's loss is divided by (each micro-batch divides its share by the same)."""
    if grpo.loss_type in ("dapo", "cispo"):
        return float(loss_tokens)
    if grpo.loss_type == "dr_grpo":
        return float(rows * grpo.dr_grpo_tokens)
    return float(rows)


def reduce_loss(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, normalizer: float,
                segments: torch.Tensor | None = None) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss.

    dapo, cispo: Σ masked token losses / (loss tokens in the whole mini-batch) — TRL loss_type "dapo", "cispo".
    grpo: Σ over sequences of (sequence's mean token loss) / (sequences in the whole mini-batch) — TRL "grpo".
    dr_grpo: Σ masked token losses / (rows in the mini-batch × a constant length) — TRL loss_type "dr_grpo".
    Summing the shares of all micro-batches gives exactly the unsplit mini-batch loss."""
    if loss_type in ("dapo", "dr_grpo", "cispo"):
        return (per_token * mask).sum() / max(normalizer, 1.0)
    if loss_type == "grpo":
        rows = per_sequence(per_token * mask, segments) / per_sequence(mask, segments).clamp(min=1.0)
        return rows.sum() / max(normalizer, 1.0)
    raise ValueError(f"unknown loss_type {loss_type!r} (expected 'dapo', 'grpo', 'dr_grpo' or 'cispo')")
