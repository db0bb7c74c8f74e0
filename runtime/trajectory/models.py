"""Wire models of the trajectory graph: a captured engine call (`Turn`), its place in a session's call graph
(`Node`), the journal's prefix-deduplicated form of a turn (`TurnDelta`), and what the learner trains on
(`TrainingSequence`, `SessionSequences`).

Token ids and logprobs are the engine's own (vLLM's `prompt_token_ids`, `choices[i].token_ids` and sampled
`logprobs`), so the learner trains on exactly what was sampled, never on a re-tokenisation.
"""

from __future__ import annotations

import base64
import math
import sys
from array import array
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    computed_field,
    model_validator,
)

# The array types token ids and logprobs are kept in, in the call graph and packed in the journal.
TOKEN_TYPE: Final = "i"  # int32 token ids
LOGPROB_TYPE: Final = "d"  # float64: the engine's logprobs, kept exactly


class Turn(BaseModel):
    """One engine call as the proxy captured it: the full templated prompt and what was sampled."""

    model_config = ConfigDict(frozen=True)

    # A list once validated; the proxy links its captures with the ids in the int32 array it read them into.
    prompt_ids: Annotated[Sequence[int], AfterValidator(list)]
    completion_ids: list[int]
    # Sampled-token logprobs, aligned with completion_ids.
    logprobs: list[float]
    finish_reason: str | None = None
    # The learner's weight version that sampled this turn; `model` is the served model or adapter name.
    policy_version: int = 0
    model: str = ""
    tool_calls: int = Field(default=0, ge=0)
    started_at: float = 0.0
    finished_at: float = 0.0
    # False keeps the turn as context only (loss mask 0), e.g. when its capture failed validation.
    trainable: bool = True
    # What the reply said (`splice.reply_key`): how a later call's history is matched to it for splicing.
    reply: str = ""


def capture_problems(turn: Turn, checked_prompt: int = 0) -> list[str]:
    """Why a captured turn cannot be trained on (empty when it can). The first `checked_prompt` prompt ids are
    known to be valid token ids (an earlier, checked turn's prompt+completion), so only the rest are scanned."""
    problems: list[str] = []
    if not turn.prompt_ids:
        problems.append("empty prompt_ids")
    if len(turn.logprobs) != len(turn.completion_ids):
        problems.append(f"{len(turn.logprobs)} logprobs for {len(turn.completion_ids)} completion tokens")
    elif not all(math.isfinite(lp) and lp <= 0.0 for lp in turn.logprobs):
        problems.append("logprobs must be finite and <= 0")
    if has_negative(turn.prompt_ids[checked_prompt:]) or has_negative(turn.completion_ids):
        problems.append("negative token id")
    return problems


def as_tokens(ids: Sequence[int]) -> array[int]:
    """`ids` as an int32 array (itself when it is one already): slices of it compare in one memcmp."""
    return ids if isinstance(ids, array) and ids.typecode == TOKEN_TYPE else array(TOKEN_TYPE, ids)


_SIGN_BYTE = 3 if sys.byteorder == "little" else 0


def has_negative(ids: Sequence[int]) -> bool:
    """Whether any id is negative, in C either way: this runs on every turn's new tokens. On an int32 array (what
    the proxy links) it reads only the sign bytes (`isascii`: no byte has its top bit set) instead of making a
    Python int per id, which `min` over an array does."""
    if isinstance(ids, array) and ids.typecode == TOKEN_TYPE and ids.itemsize == 4:
        return not memoryview(ids).cast("B")[_SIGN_BYTE::4].tobytes().isascii()
    return min(ids, default=0) < 0


class BreakCause(StrEnum):
    """Why a call did not extend the end of an earlier call's sequence and so started one more training
    sequence (a prefix break): where its prompt leaves what the session's earlier calls sent and sampled."""

    # The prompt is an earlier call's prompt again (or a prefix of one): a retry.
    retry = "retry"
    # It leaves them inside a sampled reply: a reply resent re-tokenised, without its thinking, re-serialised
    # or cut, that token splicing could not restore.
    reply_changed = "reply_changed"
    # It leaves them inside text the harness wrote: another system prompt or tools (a side call, a sub-agent),
    # a compacted or edited history, or another message after the same reply.
    history_changed = "history_changed"


class Node(BaseModel):
    """A turn placed in its session's call graph. `parent` is the earlier node whose prompt+completion is the
    longest exact token prefix of this turn's prompt (None for a root)."""

    id: int
    parent: int | None
    # How many leading prompt tokens are the parent's prompt+completion (0 for a root).
    shared_prefix: int = Field(ge=0)
    # Set when this turn is a prefix break: a later root, or a second child of its parent.
    break_cause: BreakCause | None = None
    turn: Turn


def pack(values: array[Any]) -> str:
    """An int32 or float64 array as the journal writes it: base64 of its little-endian bytes. Encoding each item as
    a JSON number cost ~3x more per record, and JSON numbers are no more exact."""
    if sys.byteorder != "little":
        values = array(values.typecode, values)
        values.byteswap()
    return base64.b64encode(values).decode("ascii")


def _unpacked(typecode: str) -> BeforeValidator:
    """Read what `pack` wrote (a list, as journals before it wrote, passes through to the field's own check)."""

    def unpack(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        values = array(typecode)
        values.frombytes(base64.b64decode(value, validate=True))  # a ValueError on bad text or a torn item
        if sys.byteorder != "little":
            values.byteswap()
        return values.tolist()

    return BeforeValidator(unpack)


class TurnDelta(BaseModel):
    """A turn as the proxy's journal stores it: only the prompt tokens beyond its parent's prompt+completion.
    Its token ids and logprobs are packed (`pack`) in the journal.

    Decoding needs the parent's full sequence, so deltas are replayed in order (see `graph.decode_delta`)."""

    id: int
    parent: int | None
    prompt_tail: Annotated[list[int], _unpacked(TOKEN_TYPE)]
    completion_ids: Annotated[list[int], _unpacked(TOKEN_TYPE)]
    logprobs: Annotated[list[float], _unpacked(LOGPROB_TYPE)]
    finish_reason: str | None = None
    policy_version: int = 0
    model: str = ""
    tool_calls: int = Field(default=0, ge=0)
    started_at: float = 0.0
    finished_at: float = 0.0
    trainable: bool = True
    reply: str = ""


class TrainingSequence(BaseModel):
    """One root→leaf path of a session's call graph, ready for the learner.

    `loss_mask` is 1 on tokens the policy sampled (in trainable turns) and 0 on context; `logprobs` are the
    engine's behaviour logprobs aligned with `token_ids` (0.0 where the mask is 0); `policy_versions` gives,
    per token, the version of the turn that introduced it (as context or as a sample)."""

    session_id: str
    node_ids: list[int]
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    policy_versions: list[int]
    tool_calls: int = Field(default=0, ge=0, description="tool calls made by the turns on this path")

    @model_validator(mode="after")
    def _aligned(self) -> TrainingSequence:
        n = len(self.token_ids)
        if not (len(self.loss_mask) == len(self.logprobs) == len(self.policy_versions) == n):
            raise ValueError(
                f"token_ids ({n}), loss_mask ({len(self.loss_mask)}), logprobs ({len(self.logprobs)}) and "
                f"policy_versions ({len(self.policy_versions)}) must have equal lengths"
            )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask values must be 0 or 1")
        if not self.node_ids:
            raise ValueError("a training sequence covers at least one node")
        return self

    @computed_field  # type: ignore[prop-decorator]
    @property
    def min_policy_version(self) -> int:
        """Oldest version among sampled tokens (among all tokens if none is sampled): what staleness is judged by."""
        return min(self._sampled_versions())

    @computed_field  # type: ignore[prop-decorator]
    @property
    def max_policy_version(self) -> int:
        return max(self._sampled_versions())

    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)

    def _sampled_versions(self) -> list[int]:
        sampled = [v for v, m in zip(self.policy_versions, self.loss_mask, strict=True) if m]
        return sampled or self.policy_versions or [0]


class SessionSequences(BaseModel):
    """A session's training data: every root→leaf sequence plus the counts the reward and metrics need."""

    session_id: str
    turns: int = Field(ge=0)
    untrainable_turns: int = Field(default=0, ge=0, description="turns kept as context only")
    tool_calls: int = Field(ge=0, description="tool calls made over the whole session")
    sequences: list[TrainingSequence]
