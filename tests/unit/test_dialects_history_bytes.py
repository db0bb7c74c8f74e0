"""Reading a body whose history extends the previous body's from its bytes (history_bytes.py): whatever the
formatting, what it gives is json.loads's object with the history cut to the new items, or None (the full parse
then decides). Random bodies with random edits check that it never gives anything else."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pytest
from harnessrl.runtime.proxy.dialects.history_bytes import SeenHistory, read_extension, seen_history

KEY = "messages"


def _seen(body: bytes) -> SeenHistory:
    seen = seen_history(body, json.loads(body), KEY)
    assert seen is not None
    return seen


def _cut(body: bytes, count: int) -> dict[str, Any]:
    data = json.loads(body)
    return {**data, KEY: data[KEY][count:]}


def _body(items: list[Any], *, head: dict[str, Any] | None = None, tail: dict[str, Any] | None = None,
          **dumps: Any) -> bytes:
    return json.dumps({**(head or {"model": "m"}), KEY: items, **(tail or {"stream": True})}, **dumps).encode()


ITEMS: list[Any] = [{"role": "user", "content": "Fix it ], {\"a\": [1, 2]} ,"},
                    {"role": "assistant", "content": [{"type": "text", "text": "ok"}], "n": 1.5},
                    {"role": "tool", "content": "\u00e9t\u00e9 \u2603 \\\"quoted\\\""}, "a string item", [1, [2, 3]], 7]


@pytest.mark.parametrize("dumps", [{}, {"indent": 2}, {"separators": (",", ":")}, {"ensure_ascii": False}],
                         ids=["default", "indented", "compact", "utf-8"])
def test_a_longer_history_reads_as_the_full_parse_cut_to_its_new_items(dumps: dict[str, Any]) -> None:
    first = _body(ITEMS[:2], **dumps)
    second = _body(ITEMS[:4], **dumps)
    third = _body(ITEMS, **dumps)
    read = read_extension(second, KEY, _seen(first))
    assert read is not None
    data, seen, reused = read
    assert data == _cut(second, 2) and seen.count == 4 and seen.end is not None and reused == 2
    read = read_extension(third, KEY, seen)  # the end is now known: one memcmp
    assert read is not None and read[0] == _cut(third, 4) and read[1].count == len(ITEMS)


@pytest.mark.parametrize("later", [
    _body([ITEMS[0], {**ITEMS[1], "n": 2}, ITEMS[2]]),  # the last seen item changed
    _body([ITEMS[0], {**ITEMS[1], "content": [{"type": "text", "text": "ok"}, {"type": "text", "text": "!"}]},
           ITEMS[2]]),  # an array inside the last seen item grew: the bodies part at an inner `]`
    _body(ITEMS[:2]),  # nothing new
    _body(ITEMS[:1]),  # shorter
    _body(ITEMS[:3], head={"model": "other"}),  # a member before the history changed
    _body(ITEMS[:3], tail={"stream": True, "model": "again"}),  # a duplicate member after the history
    _body(ITEMS[:3], tail={"stream": True, KEY: []}),  # a second history
    _body(ITEMS[:3]) + b" x",  # not JSON after the object
    _body(ITEMS[:3])[:-1],  # cut short
    _body(ITEMS[:3]).replace(b"quoted", b"quo\xffted"),  # not UTF-8
], ids=["edited", "inner-array", "same", "shorter", "head", "dup-member", "dup-history", "trailing", "short",
        "bytes"])
def test_a_body_that_does_not_extend_the_history_is_left_to_the_full_parse(later: bytes) -> None:
    seen = _seen(_body(ITEMS[:2]))
    assert read_extension(later, KEY, seen) is None


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(6 if depth < 3 else 3)
    if kind == 0:
        return rng.choice(["", "]", ",", "}", '"', "\\", "x],[y", "\u2603", "a" * rng.randrange(20)])
    if kind == 1:
        return rng.choice([0, -1, 2.5, 10**20, True, None])
    if kind == 2:
        return rng.choice(["[1]", "{}", "]]", "ok"])
    if kind == 3:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice("abcm"): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def _edit(rng: random.Random, items: list[Any]) -> list[Any]:
    """A next history: usually longer, sometimes with an earlier item changed or dropped."""
    items = [*items, *(_random_value(rng) for _ in range(rng.randrange(3)))]
    if items and rng.random() < 0.3:
        items[rng.randrange(len(items))] = _random_value(rng)
    if items and rng.random() < 0.1:
        items.pop(rng.randrange(len(items)))
    return items


@pytest.mark.parametrize("partial", [False, True], ids=["whole history", "partial"])
def test_random_bodies_read_as_json_loads_or_not_at_all(partial: bool) -> None:
    """Whole: only a body that extends all of the seen history is read. Partial: one that agrees with it up to
    some item's end is read from there, and the item ends it keeps are each item's own."""
    rng = random.Random(7)
    hits = reads_of_a_part = tails_reused = 0
    for _ in range(3000):
        items = [_random_value(rng) for _ in range(1 + rng.randrange(4))]
        style: dict[str, Any] = rng.choice([{}, {"indent": 1}, {"separators": (",", ":")}, {"ensure_ascii": False}])
        head = {"model": "m"} if rng.random() < 0.8 else {"model": "m", "system": _random_value(rng)}
        first = _body(items, head=head, **style)
        later_items = _edit(rng, items)
        tail = {"stream": rng.random() < 0.5} if rng.random() < 0.8 else {"x": _random_value(rng)}
        later = _body(later_items, head=head, tail=tail, **style)
        seen = _seen(first)
        if rng.random() < 0.5:  # the item ends of a body read before, or found by a scan
            seen = replace(seen, ends=_ends(first, items))
        read = read_extension(later, KEY, seen, partial=partial)
        if read is None:
            continue
        hits += 1
        data, seen_later, reused = read
        assert later_items[:reused] == items[:reused] and (reused == len(items) or partial)
        reads_of_a_part += reused < len(items)
        assert data == _cut(later, reused) and seen_later.count == len(later_items)
        if seen_later.ends is not None:
            assert seen_later.ends == _ends(later, later_items)
        # A third body: one more item, and the members after the history as they were, or not.
        same_tail = rng.random() < 0.5
        third = _body([*later_items, _random_value(rng)], head=head, tail=tail if same_tail else {"stream": None},
                      **style)
        read = read_extension(third, KEY, seen_later, partial=partial)
        assert read is not None
        assert read[0] == _cut(third, len(later_items))
        tails_reused += same_tail and all(read[0][k] is data[k] for k in tail)
    assert hits > 500 and tails_reused > 200
    assert (reads_of_a_part > 100) == partial


def _ends(body: bytes, items: list[Any]) -> tuple[int, ...]:
    """Where each history item ends in `body`, found the slow way: the shortest text after the previous item
    (and its `,`) that loads as the item."""
    ends, at = [], body.index(b"[", body.index(f'"{KEY}"'.encode())) + 1
    for item in items:
        start = at
        while True:
            at += 1
            try:
                if json.loads(body[start:at].lstrip(b" \n\r\t,")) == item:
                    break
            except ValueError:
                pass
        ends.append(at)
    return tuple(ends)


def test_a_history_whose_last_item_was_rewritten_reuses_the_items_before_it() -> None:
    """Claude Code's sliding cache marker: the newest message carries it, the one before is resent without it."""
    marked = {"role": "user", "content": [{"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}]}
    unmarked = {"role": "user", "content": [{"type": "text", "text": "b"}]}
    first = _body([ITEMS[0], ITEMS[1], marked])
    assert read_extension(_body([ITEMS[0], ITEMS[1], unmarked, ITEMS[2]]), KEY, _seen(first)) is None
    read = read_extension(_body([ITEMS[0], ITEMS[1], unmarked, ITEMS[2]]), KEY, _seen(first), partial=True)
    assert read is not None
    data, seen, reused = read
    assert reused == 2 and data[KEY] == [unmarked, ITEMS[2]] and seen.count == 4 and seen.ends is not None
    # A body that changed its first item shares nothing to reuse.
    assert read_extension(_body([ITEMS[1], marked, ITEMS[2]]), KEY, _seen(first), partial=True) is None
