"""Turn (sequence, advantage) pairs into padded micro-batches under a token budget. Pure.

"Packing" here is first-fit-decreasing bin packing of whole sequences into micro-batches whose padded size
(rows × longest row) stays within `micro_batch_tokens`; sequences are never cut or concatenated into one row,
so attention needs no cross-sequence masking and every backend (sdpa, eager, flash) computes the same thing.
A sequence longer than the budget gets a micro-batch of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from harnessrl.runtime.trajectory.models import TrainingSequence


@dataclass(frozen=True)
class Sample:
    sequence: TrainingSequence
    advantage: float


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # (B, T) long, right padded
    attention_mask: torch.Tensor  # (B, T) long
    loss_mask: torch.Tensor  # (B, T) float; 1 on sampled tokens
    behaviour_logps: torch.Tensor  # (B, T) float; engine logprob of token t (0 off the mask)
    advantages: torch.Tensor  # (B,) float
    sequence_ids: list[int]  # index of each row in the mini-batch's sample list

    @property
    def loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())


def trainable(samples: list[Sample]) -> list[Sample]:
    """Samples with at least one sampled token after the first position (position 0 has no prediction)."""
    return [s for s in samples if sum(s.sequence.loss_mask[1:]) > 0]


def pack(samples: list[Sample], budget: int, pad_id: int = 0) -> list[MicroBatch]:
    order = sorted(range(len(samples)), key=lambda i: -len(samples[i].sequence.token_ids))
    bins: list[list[int]] = []
    for i in order:
        n = len(samples[i].sequence.token_ids)
        for b in bins:
            # Sorted by length, the bin's first row is its longest, so the padded size is rows × that.
            width = len(samples[b[0]].sequence.token_ids)
            if (len(b) + 1) * max(width, n) <= budget:
                b.append(i)
                break
        else:
            bins.append([i])
    return [_collate([samples[i] for i in b], b, pad_id) for b in bins]


def _collate(rows: list[Sample], ids: list[int], pad_id: int) -> MicroBatch:
    width = max(len(r.sequence.token_ids) for r in rows)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    mask = torch.zeros(shape, dtype=torch.float32)
    logps = torch.zeros(shape, dtype=torch.float32)
    for j, r in enumerate(rows):
        s = r.sequence
        n = len(s.token_ids)
        input_ids[j, :n] = torch.tensor(s.token_ids, dtype=torch.long)
        attention[j, :n] = 1
        mask[j, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        logps[j, :n] = torch.tensor(s.logprobs, dtype=torch.float32)
    mask[:, 0] = 0.0  # the first token is never predicted
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=mask,
        behaviour_logps=logps,
        advantages=torch.tensor([r.advantage for r in rows], dtype=torch.float32),
        sequence_ids=ids,
    )


def split_by_tokens(samples: list[Sample], budget: int | None) -> list[list[Sample]]:
    """Contiguous chunks of at most `budget` tokens (a longer sequence is a chunk of its own); one chunk when
    there is no budget."""
    if budget is None or not samples:
        return [samples]
    out: list[list[Sample]] = [[]]
    used = 0
    for s in samples:
        n = len(s.sequence.token_ids)
        if out[-1] and used + n > budget:
            out.append([])
            used = 0
        out[-1].append(s)
        used += n
    return out


def split_mini_batches(samples: list[Sample], n: int) -> list[list[Sample]]:
    """n contiguous, near-equal chunks (fewer if there are fewer samples); order kept for determinism."""
    n = max(1, min(n, len(samples)))
    size, extra = divmod(len(samples), n)
    out, start = [], 0
    for k in range(n):
        end = start + size + (1 if k < extra else 0)
        out.append(samples[start:end])
        start = end
    return out
