"""Reading vLLM's answers when the start of the prompt is already known.

vLLM returns the whole templated prompt as `prompt_token_ids` with every answer (thousands of ids by a session's
twentieth turn), and parsing it costs a Python int per id: most of the proxy's parsing work per call. But a follow-up
turn's prompt starts with its session's previous prompt + completion, whose ids the proxy already holds in the call
graph. So the session keeps that sequence's JSON text (`KnownPrefix`), the answer's array text is compared with it
byte for byte (memcmp), and only the ids after the common part are parsed. Equal bytes are equal ids, so the result
is the full parse's; whatever does not fit (no known prefix, a prompt that does not start with it, text that is not
what this module expects) takes the full parse, which also raises the same errors on a bad answer.

On this path `prompt_token_ids` is an int32 `array` (the graph's own token type), not a list: it is only measured and
linked, never serialised.
"""

from __future__ import annotations

import re
import struct
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from harnessrl.runtime.proxy.dialects.history_bytes import common_length
from harnessrl.runtime.proxy.dialects.upstream import STREAM_CHUNK, Completion, CompletionChunk
from pydantic import TypeAdapter

_KEY = b'"prompt_token_ids"'
_OPEN = re.compile(rb"[ \t\n\r]*:[ \t\n\r]*\[")  # between the key and its array
_IDS: TypeAdapter[list[int]] = TypeAdapter(list[int])

Answer = TypeVar("Answer", Completion, CompletionChunk)


@dataclass(frozen=True, slots=True)
class AnswerShape(Generic[Answer]):
    """How to parse one kind of answer and reach its `prompt_token_ids` (a model's attribute, a chunk's key)."""

    parse: Callable[[bytes], Answer]
    prompt_ids: Callable[[Answer], Sequence[int] | None]
    set_prompt_ids: Callable[[Answer, Sequence[int]], None]


def _set_completion_ids(completion: Completion, ids: Sequence[int]) -> None:
    completion.prompt_token_ids = ids


def _set_chunk_ids(chunk: CompletionChunk, ids: Sequence[int]) -> None:
    chunk["prompt_token_ids"] = ids


COMPLETION = AnswerShape(Completion.model_validate_json, lambda c: c.prompt_token_ids, _set_completion_ids)
# The chunk's validator itself, not TypeAdapter.validate_json: its Python wrapper cost ~10% of a chunk's parse.
CHUNK = AnswerShape(STREAM_CHUNK.validator.validate_json, lambda c: c.get("prompt_token_ids"), _set_chunk_ids)


@dataclass(frozen=True, slots=True)
class KnownPrefix:
    """A token sequence a session's next prompt probably starts with (its latest turn's prompt + completion): its
    JSON text with every id followed by a comma (b"1,2,3,"), and how to get its ids, which are held once, in the
    call graph, not copied here."""

    text: bytes
    tokens: Callable[[], array[int]]
    turn: int | None = None  # the call-graph turn whose prompt + completion these are

    @classmethod
    def of(
        cls, prompt_text: bytes, completion_ids: Sequence[int], tokens: Callable[[], array[int]],
        turn: int | None = None,
    ) -> KnownPrefix | None:
        """From the prompt's array text as the engine wrote it (between the brackets) and the completion's ids;
        `tokens()` must give the prompt's ids followed by the completion's."""
        parts = [part for part in (prompt_text, ",".join(map(str, completion_ids)).encode()) if part.strip()]
        return cls(b",".join([*parts, b""]), tokens, turn) if parts else None  # each id followed by a comma


def read_answer(
    shape: AnswerShape[Answer], raw: bytes, known: KnownPrefix | None
) -> tuple[Answer, bytes | None, int | None]:
    """Parse a completion or a stream chunk's data, reusing `known`'s ids where the prompt starts with them.
    Also returns the prompt ids' text between the brackets (None when the answer has none), for the next call,
    and `known`'s turn when the prompt starts with all of `known` (else None). A plain tuple: a stream reads one
    per token."""
    if _KEY not in raw:  # a stream's chunks after the first: nothing more to do
        return shape.parse(raw), None, None
    span = _prompt_span(raw)
    if span is not None:
        split = _read_split(shape, raw, span, known)
        if split is not None:
            answer, whole = split
            return answer, raw[span[0] : span[1]], known.turn if whole and known is not None else None
    return shape.parse(raw), None, None


def _prompt_span(raw: bytes) -> tuple[int, int] | None:
    """Where the text between the brackets of the answer's one `"prompt_token_ids": [...]` lies."""
    key = raw.find(_KEY)
    if key < 0:
        return None
    opened = _OPEN.match(raw, key + len(_KEY))
    if opened is None:
        return None  # null, or not what vLLM writes
    start = opened.end()
    end = raw.find(b"]", start)
    # A second occurrence might be the real field (this one nested, or inside a string): leave it to the full parse.
    if end < 0 or raw.find(_KEY, end) >= 0:
        return None
    return start, end


def _read_split(
    shape: AnswerShape[Answer], raw: bytes, span: tuple[int, int], known: KnownPrefix | None
) -> tuple[Answer, bool] | None:
    """The answer parsed without its prompt ids, which come from `known` where its text matches, and from parsing
    only the rest, and whether all of `known` was used; None when that cannot be done exactly."""
    start, end = span
    reused = _reused(raw, start, end, known)
    try:
        if reused is None:
            ids: Sequence[int] = _IDS.validate_json(raw[start - 1 : end + 1])
        else:
            head, cut = reused
            rest = raw[start + cut : end]
            if not rest.strip():
                return None  # `[..., ]`: invalid, the full parse says why
            ids = head + _packed(head.typecode, _IDS.validate_json(b"[" + rest + b"]"))
        # The array is replaced by an empty one, which the parsed answer must then hold: the cut was its field.
        view = memoryview(raw)
        answer = shape.parse(b"".join((view[:start], view[end:])))
    except (ValueError, OverflowError):  # OverflowError: an id beyond int32, which the full parse lets through
        return None
    if shape.prompt_ids(answer) != []:
        return None
    shape.set_prompt_ids(answer, ids)
    return answer, reused is not None and known is not None and reused[1] == len(known.text)


def _packed(typecode: str, ids: list[int]) -> array[int]:
    """`array(typecode, ids)`, 4x faster: the array constructor converts each item as a function argument, struct
    packs them in one C loop. An id out of the type's range raises OverflowError, as the constructor does."""
    try:
        return array(typecode, struct.pack(f"{len(ids)}{typecode}", *ids))
    except struct.error as exc:
        raise OverflowError(str(exc)) from None


def _reused(raw: bytes, start: int, end: int, known: KnownPrefix | None) -> tuple[array[int], int] | None:
    """The known ids the array starts with, and how many bytes of its text they take (after their last comma)."""
    if known is None:
        return None
    text = known.text
    if raw.startswith(text, start, end):
        return known.tokens(), len(text)
    cut = text.rfind(b",", 0, common_length(text, raw, start, end)) + 1
    if cut == 0:
        return None
    return known.tokens()[: text.count(b",", 0, cut)], cut
