"""Reading a request body whose history extends the previous request's, from its bytes.

Harnesses resend the whole conversation on every call, so by a session's twentieth turn a body is ~45 KB of which
only the last few items are new. A full parse turns all of it into Python objects, and telling which items are new
then takes a deep comparison with the previous request's. Instead, the session keeps the previous body's bytes
(`SeenHistory`), and a body that starts with them up to the end of their history's last item (memcmp) and goes on
with `,` has that history as its first items, byte for byte: only the text after them is parsed.

Where that history ends is known exactly once a body has been read this way (the standard library's C scanner,
`json.scanner.make_scanner`, gives each value's end). After a full parse it is found against the next body: the
two agree up to some byte; the previous body must close its history there (`]`), and the next one must go on
from there with more items, then close the history and the object and end. If that text parses so, the byte was at
the history's level: had it been inside an item or a string, the text after it would close more levels, or end
inside a string, than such a parse allows. Anything else returns None and the caller takes the full parse, which
also words any error; the values read here are json.loads's, which decides what a request body is
(`load_json_object`).

Some harnesses edit the history's last items as they resend it: Claude Code moves its one sliding
`cache_control` marker to the newest message, so the message that carried it comes back without it. For a
dialect whose items convert independently, a body that agrees with the previous one only up to some item is read
from that item's end (`partial`): the end of every item is kept (`SeenHistory.ends`), found by one scan of the body
(json's C scanner) the first time it is needed, and carried on from then on.

The members after the history (the OpenAI and Anthropic SDKs write the tools there, tens of KB) are parsed
once: a body read this way keeps where they start and what they were (`SeenHistory.tail`), and the next body
that ends with the same bytes from its history's `]` on (one memcmp) gets those very objects, which also tells
the dialect that its tools are the previous call's (`ToolsMemo`, base.py).
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from json.scanner import make_scanner
from typing import Any, cast

from harnessrl.runtime.trajectory.graph import common_prefix_length

# (value, end index) of the JSON value starting at an index: json.loads's own C scanner
# (typeshed declares make_scanner's argument as the scanner class itself; it takes the decoder whose options it reads)
_SCAN: Callable[[str, int], tuple[Any, int]] = make_scanner(cast(Any, json.JSONDecoder()))
_WS = re.compile(rb"[ \t\n\r]*")
_WS_TEXT = re.compile(r"[ \t\n\r]*")


class _Unsure(Exception):
    """Text this reader does not follow: the full parse decides."""


@dataclass(frozen=True, slots=True)
class SeenHistory:
    """A body as kept for reading the next one: the body itself (kept whole, not copied), where its history's
    last item ends in it (None until found against the next body), how many history items it has, the object's
    members before the history (the same in any body that starts with the same bytes), where each history
    item ends (None until a partial read needs them), and, once read from its text, where the members after the
    history start (just after its `]`) and what they are (`tail`; the same in any body that ends with the same
    bytes from its history's `]`)."""

    body: bytes
    end: int | None
    count: int
    head: dict[str, Any]
    ends: tuple[int, ...] | None = None
    tail: tuple[int, dict[str, Any]] | None = None

    def adopt(self, name: str, value: Any) -> None:
        """Keep `value`, equal to it and shared with other sessions, as the member `name` before or after the
        history: the next body read this way then holds `value` itself."""
        for members in (self.head, self.tail[1] if self.tail is not None else {}):
            if name in members:
                members[name] = value


def seen_history(body: bytes, data: dict[str, Any], key: str) -> SeenHistory | None:
    """A fully parsed body as the next read starts from; None unless its member `key` is a non-empty list."""
    items = data.get(key)
    if not isinstance(items, list) or not items:
        return None
    head: dict[str, Any] = {}
    for name, value in data.items():  # the parse keeps the members' order
        if name == key:
            break
        head[name] = value
    return SeenHistory(body, None, len(items), head)


def read_extension(
    body: bytes, key: str, seen: SeenHistory, *, partial: bool = False
) -> tuple[dict[str, Any], SeenHistory, int] | None:
    """The body's object with `key` holding only the items after the first `reused` of `seen`'s, the body's own
    `SeenHistory`, and `reused`. Without `partial`, `reused` is all of `seen`'s items and None is returned unless
    the body is `seen`'s history followed by at least one more item; with it, a body that agrees with `seen`'s
    only up to the end of some item reuses the items before that point."""
    end = _history_end(seen, body)
    if end is not None:
        read = _read_after(body, end, key, seen, seen.count, seen.ends)
        if read is not None or not partial:
            return read
    elif not partial:
        return None
    ends = seen.ends if seen.ends is not None else _item_ends(seen.body, key)
    if ends is None or len(ends) != seen.count:
        return None
    reused = bisect_right(ends, common_length(seen.body, body, 0, len(body)))
    if not 0 < reused < seen.count:  # nothing to reuse, or all of it (which the read above refused)
        return None
    return _read_after(body, ends[reused - 1], key, seen, reused, ends)


def _read_after(
    body: bytes, end: int, key: str, seen: SeenHistory, reused: int, ends: tuple[int, ...] | None
) -> tuple[dict[str, Any], SeenHistory, int] | None:
    """The body read from `end`, where its history's first `reused` items (those of `seen`) end and at least
    one more follows. Members after the history that are `seen`'s byte for byte (tools sent after the
    conversation) are `seen`'s own objects, not parsed again."""
    try:
        text = str(memoryview(body)[end:], "utf-8")
        pos = _skip(text, 0)
        _expect(text, pos, ",")
        items, item_ends, pos = _more_items(text, _skip(text, pos + 1))
        *new_ends, tail_at = _byte_offsets(text, [*item_ends, pos], end)  # each item's end, then just after the `]`
        if seen.tail is not None and _same_ending(body, tail_at, seen.body, seen.tail[0]):
            tail = seen.tail[1]
        else:
            tail = _members_after(text, pos, key, seen.head)
    except (_Unsure, ValueError, StopIteration, RecursionError):
        return None
    kept = None if ends is None else ends[:reused] + tuple(new_ends)
    seen_now = SeenHistory(body, new_ends[-1], reused + len(items), seen.head, kept, (tail_at, tail))
    return {**seen.head, key: items, **tail}, seen_now, reused


def _same_ending(body: bytes, at: int, other: bytes, other_at: int) -> bool:
    """Whether body[at:] == other[other_at:], without copying either (a memcmp)."""
    return len(body) - at == len(other) - other_at and body.endswith(memoryview(other)[other_at:])


def _members_after(text: str, pos: int, key: str, head: dict[str, Any]) -> dict[str, Any]:
    """The members of the object from `pos`, just after its history's `]`, to its end."""
    tail: dict[str, Any] = {}
    pos = _skip(text, pos)
    while not text.startswith("}", pos):
        _expect(text, pos, ",")
        pos = _skip(text, pos + 1)
        _expect(text, pos, '"')
        name, pos = _SCAN(text, pos)
        pos = _skip(text, pos)
        _expect(text, pos, ":")
        if name == key or name in head or name in tail:  # a duplicate: the full parse decides which one counts
            raise _Unsure
        tail[name], pos = _SCAN(text, _skip(text, pos + 1))
        pos = _skip(text, pos)
    if _skip(text, pos + 1) != len(text):
        raise _Unsure
    return tail


def _byte_offsets(text: str, offsets: list[int], base: int) -> tuple[int, ...]:
    """`offsets` into `text` as offsets into the bytes it was decoded from, which start at `base`."""
    if text.isascii():
        return tuple(base + o for o in offsets)
    out, at, size = [], 0, base
    for o in offsets:
        size += len(text[at:o].encode())
        out.append(size)
        at = o
    return tuple(out)


def _item_ends(body: bytes, key: str) -> tuple[int, ...] | None:
    """Where each item of the history `key` ends in `body` (a body that parsed as an object), by one scan."""
    try:
        text = body.decode()
        pos = _skip(text, 0)
        _expect(text, pos, "{")
        pos = _skip(text, pos + 1)
        while True:
            _expect(text, pos, '"')
            name, pos = _SCAN(text, pos)
            pos = _skip(text, pos)
            _expect(text, pos, ":")
            pos = _skip(text, pos + 1)
            if name == key:
                _expect(text, pos, "[")
                _, item_ends, _ = _more_items(text, _skip(text, pos + 1))
                return _byte_offsets(text, item_ends, 0)
            _, pos = _SCAN(text, pos)
            pos = _skip(text, pos)
            _expect(text, pos, ",")
            pos = _skip(text, pos + 1)
    except (_Unsure, ValueError, StopIteration, RecursionError):
        return None


def _history_end(seen: SeenHistory, body: bytes) -> int | None:
    """Where `seen`'s history ends in `body`, if `body` starts with it."""
    if seen.end is not None:
        return seen.end if body.startswith(memoryview(seen.body)[: seen.end]) else None
    end = common_length(seen.body, body, 0, len(body))
    closing = _WS.match(seen.body, end)
    assert closing is not None  # the pattern matches the empty string
    return end if seen.body.startswith(b"]", closing.end()) else None


def _more_items(text: str, pos: int) -> tuple[list[Any], list[int], int]:
    """The items of an array from `pos`, where an item starts, to its `]`: the items, the index just after each
    one, and the index after the `]`."""
    items: list[Any] = []
    ends: list[int] = []
    while True:
        item, after = _SCAN(text, pos)
        items.append(item)
        ends.append(after)
        pos = _skip(text, after)
        if text.startswith("]", pos):
            return items, ends, pos + 1
        _expect(text, pos, ",")
        pos = _skip(text, pos + 1)


def _skip(text: str, pos: int) -> int:
    match = _WS_TEXT.match(text, pos)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _expect(text: str, pos: int, char: str) -> None:
    if not text.startswith(char, pos):
        raise _Unsure


def common_length(text: bytes, raw: bytes, start: int, end: int) -> int:
    """Length of the common prefix of `text` and raw[start:end] (raw itself is not sliced)."""
    return common_prefix_length(min(len(text), end - start),
                                lambda lo, hi: raw.startswith(text[lo:hi], start + lo))
