"""A session's call graph, built incrementally as turns arrive, and the training sequences it yields.

Linking: a new turn's parent is the earlier turn whose prompt+completion is the longest exact token prefix of the
new prompt. Every turn's prompt+completion is inserted into a radix tree (a trie whose edges hold token runs); the
parent is found by walking the new prompt down that tree, remembering the deepest point where some turn ended.
Each step of the walk consumes at least one prompt token and compares an edge with one memcmp, so linking costs
O(prompt length) whatever the number of earlier turns, and inserting costs O(tokens beyond the parent).

Memory is proportional to unique tokens: tokens live in compact int32 arrays, and the tree stores each distinct
token run once. A turn keeps no tokens of its own: its record names the tree node where its prompt+completion
ends, and its tokens are read back up the tree (each node knows its parent's number, not the parent itself, so
the tree has no reference cycles and a finished session's tree is freed at once, without the garbage collector).

Shapes that follow from the rule: a retry (same prompt again) becomes a sibling of the first try; a sub-agent or a
rewritten history (compaction, a harness that edits earlier messages) shares no full turn as prefix and starts a
new root. Each root→leaf path is one training sequence; a turn's sampled tokens are trained (loss mask 1) in the
first sequence that contains them and are context (mask 0) in the others, so no sample is counted twice.

A turn that starts one more sequence (a later root, or a second child) is a prefix break; its cause
(`BreakCause`) is read where its prompt leaves the tree: inside an earlier call's sampled reply, inside text the
harness wrote, or nowhere (a retry). Counted per session in `breaks`.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from harnessrl.runtime.trajectory.models import (
    LOGPROB_TYPE,
    TOKEN_TYPE,
    BreakCause,
    Node,
    SessionSequences,
    TrainingSequence,
    Turn,
    TurnDelta,
    as_tokens,
    capture_problems,
    has_negative,
    pack,
)
from harnessrl.runtime.trajectory.splice import ROOT_CHAIN, Chain, chain_key


class _Edge:
    """A radix-tree node and the token run on the edge leading to it."""

    __slots__ = ("children", "ends", "label", "number", "parent")

    def __init__(self, label: array[int], number: int, parent: int) -> None:
        self.label = label
        self.number = number  # its place in `PrefixIndex.edges`
        self.parent = parent  # the parent's number (-1 for the root)
        self.children: dict[int, _Edge] = {}
        # Ids of turns whose prompt+completion ends exactly here: a tuple, which the garbage collector stops
        # tracking, where a list per edge would be one more object for every collection to visit.
        self.ends: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Match:
    """Where the longest inserted sequence that prefixes a query ends: turn id, its length, its tree position;
    and how many leading tokens the query shares with some inserted sequence (`reach`), with a tree node below
    which every sequence sharing that many ends (`below`)."""

    turn: int | None
    length: int
    edge: _Edge
    reach: int
    below: _Edge


class PrefixIndex:
    """Radix tree over the prompt+completion token sequences of a session's turns.

    `steps` counts tree nodes visited and `compared` counts tokens compared, over the index's life, so tests can
    check that linking work does not depend on how many turns came before."""

    def __init__(self) -> None:
        self.root = _Edge(array(TOKEN_TYPE), 0, -1)
        self.edges = [self.root]
        self.steps = 0
        self.compared = 0

    def longest(self, query: array[int], start: Match | None = None) -> Match:
        """The longest inserted sequence that is a prefix of `query` (the most recent turn among equal ones).
        `start`: where an inserted sequence that `query` is known to start with ends; the walk goes on from
        there, which finds what a walk from the root would (no turn ends deeper on the way to it)."""
        # The deepest point where a turn ends (a Match is made once, at the end).
        best, best_depth = (self.root, 0) if start is None else (start.edge, start.length)
        edge, depth, n = best, best_depth, len(query)
        reach = n  # unless the walk stops short of the query's end
        steps = compared = 0
        while depth < n:
            child = edge.children.get(query[depth])
            steps += 1
            if child is None:
                reach, below = depth, edge
                break
            k = len(child.label)
            compared += min(k, n - depth)
            if depth + k > n or query[depth : depth + k] != child.label:
                reach, below = depth + _common_prefix(child.label, query, depth), child
                break
            edge, depth = child, depth + k
            if edge.ends:
                best, best_depth = edge, depth
        else:
            below = edge
        self.steps += steps
        self.compared += compared
        return Match(best.ends[-1] if best.ends else None, best_depth, best, reach, below)

    def first_end(self, edge: _Edge) -> int:
        """A turn whose sequence runs through `edge` and beyond it where any does (the first child's side)."""
        while edge.children:
            edge = next(iter(edge.children.values()))
        return edge.ends[0]

    def insert(self, seq: array[int], turn: int, start: Match) -> _Edge:
        """Insert `seq` (which starts with the sequence `start` matched) as the sequence of `turn`; returns the
        node where it ends."""
        edge, pos, n = start.edge, start.length, len(seq)
        while pos < n:
            self.steps += 1
            child = edge.children.get(seq[pos])
            if child is None:
                leaf = self._edge(seq[pos:], edge)
                edge.children[seq[pos]] = leaf
                edge, pos = leaf, n
                break
            label = child.label
            common = _common_prefix(label, seq, pos)
            self.compared += common
            if common == len(label):
                edge, pos = child, pos + common
                continue
            # Split the edge where `seq` leaves it (or ends inside it).
            middle = self._edge(label[:common], edge)
            child.label, child.parent = label[common:], middle.number
            middle.children[child.label[0]] = child
            edge.children[seq[pos]] = middle
            edge, pos = middle, pos + common
        edge.ends += (turn,)
        return edge

    def _edge(self, label: array[int], parent: _Edge) -> _Edge:
        edge = _Edge(label, len(self.edges), parent.number)
        self.edges.append(edge)
        return edge

    def tokens(self, end: int, length: int, start: int = 0) -> array[int]:
        """Tokens `start` to `length` of the inserted sequence of `length` tokens that ends at edge number `end`,
        read up the tree."""
        need = length - start
        labels: list[array[int] | memoryview] = []
        number, got = end, 0
        while got < need:
            edge = self.edges[number]
            labels.append(edge.label)
            got += len(edge.label)
            number = edge.parent
        labels.reverse()
        if got > need:
            labels[0] = memoryview(labels[0])[got - need :]
        # Joined as bytes, one copy of each run: growing an array run by run reallocates it each time (~4x slower
        # for a 20-turn session's 10,000 tokens on mimalloc).
        out = array(TOKEN_TYPE)
        out.frombytes(b"".join(labels))
        return out


def common_prefix_length(n: int, agree: Callable[[int, int], bool]) -> int:
    """The length of the common prefix of two sequences (at most `n`), by halving: `agree(lo, hi)` says whether
    their items lo..hi-1 are equal, one memcmp-speed comparison of slices (bytes, token arrays)."""
    if agree(0, n):
        return n
    lo, hi = 0, n  # invariant: items [0, lo) agree, [0, hi) do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if agree(lo, mid):
            lo = mid
        else:
            hi = mid
    return lo


def _common_prefix(label: array[int], seq: array[int], pos: int) -> int:
    """Length of the common prefix of `label` and seq[pos:]."""
    return common_prefix_length(min(len(label), len(seq) - pos),
                                lambda lo, hi: label[lo:hi] == seq[pos + lo : pos + hi])


@dataclass(slots=True)
class _Record:
    """One turn as the graph keeps it: its place in the tree and the turn's scalar fields (not a copy of the
    model), so a turn costs the garbage collector two objects to visit (this and its logprobs)."""

    parent: int | None
    shared: int  # len(prompt+completion of parent)
    end: int  # the number of the tree node where the turn's prompt+completion ends
    prompt_len: int
    seq_len: int  # len(prompt+completion)
    logprobs: array[float]  # empty when not trainable
    valid_ids: bool  # no negative id in prompt+completion
    finish_reason: str | None
    policy_version: int
    model: str
    tool_calls: int
    started_at: float
    finished_at: float
    trainable: bool
    reply: str
    chain: bytes  # the key of the replies on its path (`splice.chain_key`)
    cause: BreakCause | None  # why it starts one more sequence, if it does
    children: tuple[int, ...] = ()

    def scalars(self) -> dict[str, Any]:
        """The turn's fields other than its token lists, as `Turn` and `TurnDelta` name them."""
        return {"finish_reason": self.finish_reason, "policy_version": self.policy_version, "model": self.model,
                "tool_calls": self.tool_calls, "started_at": self.started_at, "finished_at": self.finished_at,
                "trainable": self.trainable, "reply": self.reply}


class SessionGraph:
    """The call graph of one session. Not thread-safe: one owner adds turns (the proxy serialises per session)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.index = PrefixIndex()
        self._records: list[_Record] = []
        self._chains: dict[bytes, int] = {}  # the latest turn at the end of each path of replies
        self.tool_calls = 0
        self.untrainable = 0
        self.breaks: dict[BreakCause, int] = {}

    def __len__(self) -> int:
        return len(self._records)

    # ------------------------------------------------------------------ building

    def add(self, turn: Turn, after: int | None = None) -> Node:
        """Link `turn` to its parent and record it. Costs O(prompt length + completion length). `after`: a turn
        whose prompt+completion the prompt is known to start with (the proxy read it so, byte for byte); the link
        then walks only what follows it, not the tree from the root, one step per earlier turn."""
        prompt = as_tokens(turn.prompt_ids)
        completion = as_tokens(turn.completion_ids)
        start = None
        if after is not None:
            known = self._record(after)
            edge = self.index.edges[known.end]
            start = Match(after, known.seq_len, edge, known.seq_len, edge)
        match = self.index.longest(prompt, start)
        tail = prompt[match.length :]
        # The matched prefix is the parent's prompt+completion: if those were all valid ids, only new ones are
        # checked, so a long prompt costs nothing here beyond its new tokens.
        parent_valid = match.turn is not None and self._records[match.turn].valid_ids
        trainable = turn.trainable and not capture_problems(turn, match.length if parent_valid else 0)
        turn_id = len(self._records)
        breaks = turn_id > 0 and (match.turn is None or bool(self._records[match.turn].children))
        record = _Record(
            parent=match.turn,
            shared=match.length,
            end=self.index.insert(prompt + completion, turn_id, match).number,
            prompt_len=len(prompt),
            seq_len=len(prompt) + len(completion),
            logprobs=array(LOGPROB_TYPE, turn.logprobs) if trainable else array(LOGPROB_TYPE),
            valid_ids=(parent_valid or match.length == 0) and not has_negative(tail) and not has_negative(completion),
            finish_reason=turn.finish_reason,
            policy_version=turn.policy_version,
            model=turn.model,
            tool_calls=turn.tool_calls,
            started_at=turn.started_at,
            finished_at=turn.finished_at,
            trainable=trainable,
            reply=turn.reply,
            chain=chain_key(self._records[match.turn].chain if match.turn is not None else ROOT_CHAIN, turn.reply),
            cause=self._break_cause(match, len(prompt)) if breaks else None,
        )
        if record.cause is not None:
            self.breaks[record.cause] = self.breaks.get(record.cause, 0) + 1
        self._records.append(record)
        self._chains[record.chain] = turn_id
        if match.turn is not None:
            self._records[match.turn].children += (turn_id,)
        self.tool_calls += turn.tool_calls
        self.untrainable += not trainable
        return Node(id=turn_id, parent=match.turn, shared_prefix=match.length, break_cause=record.cause, turn=turn)

    def _break_cause(self, match: Match, prompt_len: int) -> BreakCause:
        """Where a prompt that breaks the prefix chain leaves the earlier turns' sequences (`match.reach`): the
        turn on the path of a sequence through that point that holds the first differing token tells whether it
        was sampled (its reply) or written by the harness (its prompt tail)."""
        if match.reach == prompt_len:
            return BreakCause.retry
        owner: int | None = self.index.first_end(match.below)
        while owner is not None and self._records[owner].shared > match.reach:
            owner = self._records[owner].parent
        if owner is not None and self._records[owner].prompt_len <= match.reach < self._records[owner].seq_len:
            return BreakCause.reply_changed
        return BreakCause.history_changed

    # ------------------------------------------------------------------ journal form

    def delta(self, turn_id: int) -> dict[str, Any]:
        """The turn as the journal stores it, a `TurnDelta` in its JSON form: only the tokens beyond its
        parent's prompt+completion, packed. Built as a dict, not validated: its arrays are the graph's own, and
        validating ~500 ids again per turn cost more than the rest of recording it. Replay validates it."""
        r = self._record(turn_id)
        tokens = self.index.tokens(r.end, r.seq_len, r.shared)  # prompt tail, then completion
        cut = r.prompt_len - r.shared
        return {"id": turn_id, "parent": r.parent, "prompt_tail": pack(tokens[:cut]),
                "completion_ids": pack(tokens[cut:]), "logprobs": pack(r.logprobs), **r.scalars()}

    def decode_delta(self, delta: TurnDelta) -> Turn:
        """The full turn a journal delta stands for; its parent must already be in this graph."""
        if delta.parent is not None and not 0 <= delta.parent < len(self._records):
            raise ValueError(f"turn {delta.id} names parent {delta.parent}, which this session does not hold")
        head = self.sequence_ids(delta.parent) if delta.parent is not None else []
        meta = delta.model_dump(exclude={"id", "parent", "prompt_tail", "completion_ids", "logprobs"})
        return Turn(
            prompt_ids=head + delta.prompt_tail,
            completion_ids=delta.completion_ids,
            logprobs=delta.logprobs,
            **meta,
        )

    def add_delta(self, delta: TurnDelta) -> Node:
        """Replay one journal record. Linking is deterministic, so it must land where it was recorded."""
        if delta.id != len(self._records):
            raise ValueError(f"journal out of order: expected turn {len(self._records)}, got {delta.id}")
        node = self.add(self.decode_delta(delta))
        if node.parent != delta.parent:
            raise ValueError(f"turn {delta.id} relinked to {node.parent}, journal says {delta.parent}")
        return node

    @classmethod
    def from_deltas(cls, session_id: str, deltas: Iterable[TurnDelta]) -> SessionGraph:
        graph = cls(session_id)
        for delta in deltas:
            graph.add_delta(delta)
        return graph

    # ------------------------------------------------------------------ reading

    def _record(self, turn_id: int) -> _Record:
        if not 0 <= turn_id < len(self._records):
            raise KeyError(f"session {self.session_id} has no turn {turn_id}")
        return self._records[turn_id]

    def path(self, turn_id: int) -> list[int]:
        """Turn ids from the root down to `turn_id`."""
        ids: list[int] = []
        current: int | None = turn_id
        while current is not None:
            ids.append(current)
            current = self._record(current).parent
        return ids[::-1]

    def prompt_tokens(self, turn_id: int) -> array[int]:
        return self.sequence_tokens(turn_id)[: self._record(turn_id).prompt_len]

    def sequence_tokens(self, turn_id: int) -> array[int]:
        """prompt + completion of a turn, as an int32 array (no Python int per token)."""
        r = self._record(turn_id)
        return self.index.tokens(r.end, r.seq_len)

    def prompt_ids(self, turn_id: int) -> list[int]:
        return self.prompt_tokens(turn_id).tolist()

    def sequence_ids(self, turn_id: int) -> list[int]:
        """prompt + completion of a turn."""
        return self.sequence_tokens(turn_id).tolist()

    def node(self, turn_id: int) -> Node:
        r = self._record(turn_id)
        tokens = self.sequence_tokens(turn_id)
        turn = Turn(prompt_ids=tokens[: r.prompt_len].tolist(), completion_ids=tokens[r.prompt_len :].tolist(),
                    logprobs=r.logprobs.tolist(), **r.scalars())
        return Node(id=turn_id, parent=r.parent, shared_prefix=r.shared, break_cause=r.cause, turn=turn)

    def chain_for(self, keys: Sequence[bytes]) -> Chain | None:
        """The earlier turn at the end of the longest leading path of replies among `keys` (`splice.chain_keys`
        of a history's assistant messages): its tokens and where its path's replies lie in them. None when not
        even the first reply is one of this session's."""
        for matched in range(len(keys), 0, -1):
            turn_id = self._chains.get(keys[matched - 1])
            if turn_id is not None:
                spans = [(self._records[i].prompt_len, self._records[i].seq_len) for i in self.path(turn_id)]
                return Chain(self.sequence_tokens(turn_id), spans)
        return None

    def has_chain(self, key: bytes) -> bool:
        """Whether a path of this session's replies has the key `key` (`splice.chain_key`)."""
        return key in self._chains

    def break_cause(self, turn_id: int) -> BreakCause | None:
        return self._record(turn_id).cause

    def children(self, turn_id: int) -> list[int]:
        return list(self._record(turn_id).children)

    def roots(self) -> list[int]:
        return [i for i, r in enumerate(self._records) if r.parent is None]

    def leaves(self) -> list[int]:
        return [i for i, r in enumerate(self._records) if not r.children]

    def training_sequences(self) -> list[TrainingSequence]:
        """One sequence per root→leaf path, leaves in arrival order; each sample is trained in one sequence."""
        trained: set[int] = set()
        sequences = []
        for leaf in self.leaves():
            mask, logprobs, versions = array("b"), array(LOGPROB_TYPE), array("q")
            path = self.path(leaf)
            for i in path:
                r = self._records[i]
                version = r.policy_version
                n_tail, n_out = r.prompt_len - r.shared, r.seq_len - r.prompt_len
                train = r.trainable and i not in trained
                trained.add(i)
                mask += array("b", [0]) * n_tail + array("b", [1 if train else 0]) * n_out
                logprobs += array(LOGPROB_TYPE, [0.0]) * n_tail
                logprobs += r.logprobs if train else array(LOGPROB_TYPE, [0.0]) * n_out
                versions += array("q", [version]) * (n_tail + n_out)
            sequences.append(
                TrainingSequence(
                    session_id=self.session_id,
                    node_ids=path,
                    token_ids=self.sequence_ids(leaf),
                    loss_mask=mask.tolist(),
                    logprobs=logprobs.tolist(),
                    policy_versions=versions.tolist(),
                    tool_calls=sum(self._records[i].tool_calls for i in path),
                )
            )
        return sequences

    def sequences(self) -> SessionSequences:
        return SessionSequences(
            session_id=self.session_id,
            turns=len(self._records),
            untrainable_turns=self.untrainable,
            tool_calls=self.tool_calls,
            sequences=self.training_sequences(),
        )
