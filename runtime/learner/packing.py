"""Turn (sequence, advantage) pairs into micro-batches under a token budget. Pure.

First-fit-decreasing bin packing of whole sequences (never cut) into micro-batches. `pack_flat` (the default)
concatenates a micro-batch's sequences into one row whose position_ids restart at each sequence: transformers
builds block-causal masks from them (sdpa, eager) or runs varlen attention (flash), so no padding token is
computed. `pack` pads rows to the longest instead (rows × longest row within the budget). A sequence longer
than the budget gets a micro-batch of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from harnessrl.runtime.trajectory.models import TrainingSequence


@dataclass(frozen=True)
class Sample:
    sequence: TrainingSequence
    advantage: float
    rollout: str = ""  # what `balance.balanced` weighs by
    harness: str = ""


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # (B, T) long, right padded
    attention_mask: torch.Tensor  # (B, T) long
    loss_mask: torch.Tensor  # (B, T) float; 1 on sampled tokens
    behaviour_logps: torch.Tensor  # (B, T) float; engine logprob of token t (0 off the mask)
    advantages: torch.Tensor  # (B,) float, or (1, T) per token when padding-free
    sequence_ids: list[int]  # index of each sequence in the mini-batch's sample list
    # Padding-free (pack_flat): one row of concatenated sequences; positions restart at 0 for each, which is
    # how transformers recognises packed sequences (block-causal masks for sdpa/eager, varlen for flash).
    position_ids: torch.Tensor | None = None  # (1, T) long
    segments: torch.Tensor | None = None  # (1, T) long: which of sequence_ids each token belongs to

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


def pack_flat(samples: list[Sample], budget: int) -> list[MicroBatch]:
    """Padding-free: first-fit decreasing into rows of at most `budget` real tokens (a longer sequence is a row
    of its own); no padding token is computed."""
    order = sorted(range(len(samples)), key=lambda i: -len(samples[i].sequence.token_ids))
    bins: list[list[int]] = []
    used: list[int] = []
    for i in order:
        n = len(samples[i].sequence.token_ids)
        for k, b in enumerate(bins):
            if used[k] + n <= budget:
                b.append(i)
                used[k] += n
                break
        else:
            bins.append([i])
            used.append(n)
    return [_concat([samples[i] for i in b], b) for b in bins]


def _concat(rows: list[Sample], ids: list[int]) -> MicroBatch:
    def cat(values: list[list[float]] | list[list[int]], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([v for vs in values for v in vs], dtype=dtype).unsqueeze(0)

    seqs = [r.sequence for r in rows]
    mask = cat([[0.0, *s.loss_mask[1:]] for s in seqs], torch.float32)  # each sequence's first token: no prediction
    input_ids = cat([s.token_ids for s in seqs], torch.long)
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        loss_mask=mask,
        behaviour_logps=cat([s.logprobs for s in seqs], torch.float32),
        advantages=cat([[r.advantage] * len(r.sequence.token_ids) for r in rows], torch.float32),
        sequence_ids=ids,
        position_ids=cat([list(range(len(s.token_ids))) for s in seqs], torch.long),
        segments=cat([[j] * len(s.token_ids) for j, s in enumerate(seqs)], torch.long),
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
