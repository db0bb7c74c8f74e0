"""Token splicing: the prompt of a session's next call with each earlier reply as the ids that were sampled.

Harnesses send their own past replies back as text, and rarely as they got it: thinking stripped, tool arguments
re-serialised (keys reordered, spacing changed), text the engine then tokenises anew (`fish`+`ing` sampled,
`fishing` re-encoded). The templated prompt then no longer starts with the earlier turn's prompt + sampled ids, and
the session's call graph splits into several training sequences. Splicing puts the sampled ids back:

1. Each assistant message of the history is reduced to a `reply_key` (its text without thinking and whitespace,
   and its tool calls with their arguments parsed), the same key the proxy computed for the reply it returned.
   The keys of the history's assistant messages, rolled up in order (`chain_keys`), name the earlier turn whose
   path of replies they are (`SessionGraph.chain_for`); a reply the harness really changed (an edit, a summary)
   has another key, and splicing stops before it. Assistant messages the harness wrote itself before the first
   reply (a canned acknowledgement) are context, as in the first call's prompt.
2. `splice` aligns the engine's rendering of the history with that turn's tokens: the context between replies
   must be token for token what it was (an edited user message or tool result is a real rewrite: splicing stops
   there, so the call branches as it would without splicing), each rendered reply runs up to the template's
   end-of-turn token, and is replaced by the sampled ids. The tokens after the last spliced reply are the
   rendering's own.

Pure functions; the proxy does the I/O (splicing.py there).
"""

from __future__ import annotations

import hashlib
import json
import re
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from harnessrl.runtime.trajectory.models import as_tokens

_THINKING = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_SPACE = re.compile(r"\s+")
ROOT_CHAIN = b""


def reply_key(text: str | None, tool_calls: Iterable[tuple[str, str]] = ()) -> str:
    """What a reply says, in a form the harnesses' rewrites of it keep: thinking blocks and all whitespace out of
    the text, each tool call as its name and its arguments parsed and written with sorted keys (arguments that
    are not JSON are kept as text without whitespace). A short digest: the call graph keeps one per turn."""
    body = _SPACE.sub("", _THINKING.sub("", text or ""))
    calls = [[name, _canonical_arguments(arguments)] for name, arguments in tool_calls]
    return hashlib.blake2b(json.dumps([body, calls]).encode(), digest_size=12).hexdigest()


def _canonical_arguments(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return _SPACE.sub("", arguments)


def chain_key(parent: bytes, reply: str) -> bytes:
    """The key of a path of replies: its parent path's key and its last reply's."""
    return hashlib.blake2b(parent + reply.encode(), digest_size=12).digest()


def chain_keys(replies: Iterable[str], parent: bytes = ROOT_CHAIN,
               starts: Callable[[bytes], bool] = lambda key: True) -> list[bytes]:
    """The keys of each leading path of `replies` (the history's assistant messages, in order), after the path
    `parent`. Until a path has started, a message whose key `starts` no path of the session is the harness's own
    text before its first reply (Qwen Code and Gemini CLI open with a canned "Got it. Thanks for the context!"):
    it gets ROOT_CHAIN, which names no turn, and the path starts after it."""
    keys, key = [], parent
    for reply in replies:
        step = chain_key(key, reply)
        if key != ROOT_CHAIN or starts(step):
            key = step
        keys.append(key)
    return keys


@dataclass(frozen=True, slots=True)
class Chain:
    """An earlier turn's prompt + completion and, for the turns on its path whose replies the history repeats,
    the span of each one's sampled ids in it, in order."""

    tokens: Sequence[int]
    replies: Sequence[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class Spliced:
    tokens: array[int]
    replies: int  # how many of the chain's replies were spliced in (the leading ones)


def splice(rendered: Sequence[int], chain: Chain, end_token: int) -> Spliced | None:
    """The rendered prompt with the chain's leading replies replaced by their sampled ids, or None when not even
    the first reply can be placed (the context before it differs: a new root, as the rendered prompt is).

    Reply j of the rendering starts where the chain's context before it ends (that context must be identical)
    and ends with the first `end_token` after that. A sampled reply that ends with `end_token` replaces it all;
    one that does not (cut at the token limit, or ended by another stop token) is followed by the template's
    `end_token`, as the rendering closes it, so the next context reads as the template writes it."""
    tokens, rendered = as_tokens(chain.tokens), as_tokens(rendered)
    done = pos = 0  # chain tokens spliced so far; where the rendering continues
    count = 0
    for start, end in chain.replies:
        ctx = tokens[done:start]
        reply = pos + len(ctx)
        if rendered[pos:reply] != ctx:
            break
        try:
            close = rendered.index(end_token, reply)
        except ValueError:
            break
        done, count = end, count + 1
        pos = close + 1 if end > start and tokens[end - 1] == end_token else close
    if count == 0:
        return None
    return Spliced(tokens[:done] + rendered[pos:], count)
