"""A training sequence as the rollout page shows it: each token with its text, its values and its colour.

The colour encodes one of the token's values (the page's `colour` choice); every value is in its title, so a
hover shows them all. Context tokens (loss mask 0) are not trained on: only the mask and version colourings
colour them. Pure functions: the page and the JSON API both take these rows.
"""

from __future__ import annotations

import math
from enum import StrEnum
from pathlib import Path
from typing import Any

from harnessrl.runtime.trajectory.models import TrainingSequence
from pydantic import BaseModel

CONTEXT = (238, 238, 238)  # a token the loss does not see, under logprob and advantage
# Policy versions in turn (Okabe-Ito's colour-blind safe palette, lightened to keep text readable).
VERSION_PALETTE = [(230, 159, 0), (86, 180, 233), (0, 158, 115), (240, 228, 66), (0, 114, 178), (213, 94, 0),
                   (204, 121, 167)]


class Colouring(StrEnum):
    logprob = "logprob"
    advantage = "advantage"
    mask = "mask"
    version = "version"


class TokenView(BaseModel):
    id: int
    text: str
    mask: int
    logprob: float
    version: int
    advantage: float
    colour: str  # a CSS rgb()

    @property
    def title(self) -> str:
        return (f"token {self.id} · logprob {self.logprob:.4f} (p {math.exp(self.logprob):.3f}) · "
                f"loss mask {self.mask} · advantage {self.advantage:+.4f} · policy version {self.version}")


def _mix(rgb: tuple[int, int, int], share: float) -> tuple[int, int, int]:
    """`rgb` at `share` (0..1) over white."""
    share = min(max(share, 0.0), 1.0)
    r, g, b = (round(255 - (255 - c) * share) for c in rgb)
    return (r, g, b)


def colour(by: Colouring, mask: int, logprob: float, advantage: float, version: int) -> tuple[int, int, int]:
    """logprob: white at p = 1 to red at p = 0; advantage: green above 0, red below, full at |A| >= 1; mask:
    blue on trained tokens; version: one palette colour per policy version."""
    if by is Colouring.version:
        return VERSION_PALETTE[version % len(VERSION_PALETTE)]
    if by is Colouring.mask:
        return (160, 200, 255) if mask else (255, 255, 255)
    if not mask:
        return CONTEXT
    if by is Colouring.logprob:
        return _mix((230, 60, 60), 1.0 - math.exp(logprob))
    return _mix((40, 170, 70) if advantage >= 0 else (230, 60, 60), abs(advantage))


def css(rgb: tuple[int, int, int]) -> str:
    return f"rgb({rgb[0]}, {rgb[1]}, {rgb[2]})"


def token_views(seq: TrainingSequence, texts: list[str], advantage: float, by: Colouring) -> list[TokenView]:
    """Each token of `seq`; sampled tokens carry the rollout's advantage, context tokens none."""
    rows = []
    for tid, text, mask, lp, version in zip(seq.token_ids, texts, seq.loss_mask, seq.logprobs, seq.policy_versions,
                                            strict=True):
        a = advantage if mask else 0.0
        rows.append(TokenView(id=tid, text=text, mask=mask, logprob=lp, version=version, advantage=a,
                              colour=css(colour(by, mask, lp, a, version))))
    return rows


class Detokenizer:
    """Each token's own text, by the model's tokenizer (its tokenizer.json, read with `tokenizers`, without
    transformers); without one, the token ids."""

    def __init__(self, model_dir: Path | None) -> None:
        self._tokenizer: Any = None
        path = model_dir / "tokenizer.json" if model_dir else None
        if path is not None and path.exists():
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(path))

    def texts(self, ids: list[int]) -> list[str]:
        if self._tokenizer is None:
            return [f"⟨{i}⟩" for i in ids]
        return list(self._tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False))

    def text(self, ids: list[int]) -> str:
        """`ids` decoded together (a character may span tokens)."""
        if self._tokenizer is None:
            return "".join(self.texts(ids))
        return str(self._tokenizer.decode(ids, skip_special_tokens=False))
