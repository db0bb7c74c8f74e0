"""The GRPO/DAPO token loss. Pure torch: tensors in, per-token loss and statistics out.

Same arithmetic as TRL's `GRPOTrainer._compute_loss` (token-level importance sampling, two-sided clip with
separate low/high epsilons, optional vLLM truncated importance-sampling weight), with one difference in what
"old" means: the engine's sampled logprobs are the behaviour policy, because rollouts come asynchronously from
an engine that may be several versions behind. With TIS on, the trainer's own logprobs at the start of the step
are the proximal "old" policy and exp(old − engine), capped, reweights each token (as TRL does with vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from harnessrl.runtime.learner.config import GrpoConfig


@dataclass
class TokenLoss:
    per_token: torch.Tensor  # (B, T) loss before masking/normalisation
    clipped: torch.Tensor  # (B, T) bool: token's ratio is outside the clip region on the side that matters
    kl: torch.Tensor  # (B, T) k3 estimate of KL(behaviour || current) per token


def token_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    is_weights: torch.Tensor | None = None,
) -> TokenLoss:
    """logps/old_logps: (B, T); advantages: (B,) or (B, T); is_weights: (B, T) or None."""
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    log_ratio = logps - old_logps
    coef_1 = torch.exp(log_ratio)
    coef_2 = torch.clamp(coef_1, 1 - clip_low, 1 + clip_high)
    per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    if is_weights is not None:
        per_token = per_token * is_weights
    with torch.no_grad():
        clipped = ((coef_1 < 1 - clip_low) & (adv < 0)) | ((coef_1 > 1 + clip_high) & (adv > 0))
        kl = torch.exp(log_ratio) - 1 - log_ratio
    return TokenLoss(per_token=per_token, clipped=clipped, kl=kl.detach())


def tis_weights(trainer_old_logps: torch.Tensor, engine_logps: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling: min(π_trainer_old / π_engine, cap) per token (TRL's token_truncate)."""
    return torch.clamp(torch.exp(trainer_old_logps - engine_logps), max=cap).detach()


def loss_normalizer(grpo: GrpoConfig, loss_tokens: int, rows: int) -> float:
    """What the whole mini-batch's loss is divided by (each micro-batch divides its share by the same)."""
    if grpo.loss_type == "dapo":
        return float(loss_tokens)
    if grpo.loss_type == "dr_grpo":
        return float(rows * grpo.dr_grpo_tokens)
    return float(rows)


def reduce_loss(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, normalizer: float,
                segments: torch.Tensor | None = None) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss.

    dapo: Σ masked token losses / (loss tokens in the whole mini-batch) — TRL loss_type "dapo".
    grpo: Σ over rows of (row's mean token loss) / (rows in the whole mini-batch) — TRL loss_type "grpo".
    dr_grpo: Σ masked token losses / (rows in the mini-batch × a constant length) — TRL loss_type "dr_grpo".
    Summing the shares of all micro-batches gives exactly the unsplit mini-batch loss."""
    if loss_type in ("dapo", "dr_grpo"):
        return (per_token * mask).sum() / max(normalizer, 1.0)
    if loss_type == "grpo":
        if segments is not None:  # padding-free: a sequence is a segment of the row, not the row
            n = int(segments.max()) + 1
            sums = torch.zeros(n, dtype=per_token.dtype, device=per_token.device).scatter_add(
                0, segments.flatten(), (per_token * mask).flatten())
            counts = torch.zeros(n, dtype=mask.dtype, device=mask.device).scatter_add(0, segments.flatten(), mask.flatten())
            return (sums / counts.clamp(min=1.0)).sum() / max(normalizer, 1.0)
        rows = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return rows.sum() / max(normalizer, 1.0)
    raise ValueError(f"unknown loss_type {loss_type!r} (expected 'dapo', 'grpo' or 'dr_grpo')")
