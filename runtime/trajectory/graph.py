"""A session's call graph, built incrementally as turns arrive, and the training sequences it yields.

Linking: a new turn's parent is the earlier turn whose prompt+completion is the longest exact token prefix of the
new prompt. Every turn's prompt+completion is inserted into a radix tree (a trie whose edges hold token runs); the
parent is found by walking the new prompt down that tree, remembering the deepest point where some turn ended.
Each step of the walk consumes at least one prompt token and compares an edge with one memcmp, so linking costs
O(prompt length) whatever the number of earlier turns, and inserting costs O(tokens beyond the parent).

Memory is proportional to unique tokens: tokens live in compact int32 arrays, a turn stores only what follows its
parent's prompt+completion (its *tail*) and its completion, and the tree stores each distinct token run once.

Shapes that follow from the rule: a retry (same prompt again) becomes a sibling of the first try; a sub-agent or a
rewritten history (compaction, a harness that edits earlier messages) shares no full turn as prefix and starts a
new root. Each root→leaf path is one training sequence; a turn's sampled tokens are trained (loss mask 1) in the
first sequence that contains them and are context (mask 0) in the others, so no sample is counted twice.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from harnessrl.runtime.trajectory.models import (
    Node,
    SessionSequences,
    TrainingSequence,
    Turn,
    TurnDelta,
    capture_problems,
    has_negative,
)

TOKEN_TYPE: Final = "i"  # int32 token ids
LOGPROB_TYPE: Final = "d"  # float64: the engine's logprobs, kept exactly


def as_tokens(ids: Sequence[int]) -> array[int]:
    return ids if isinstance(ids, array) and ids.typecode == TOKEN_TYPE else array(TOKEN_TYPE, ids)


class _Edge:
    """A radix-tree node and the token run on the edge leading to it."""

    __slots__ = ("children", "ends", "label")

    def __init__(self, label: array[int]) -> None:
        self.label = label
        self.children: dict[int, _Edge] = {}
        self.ends: list[int] = []  # ids of turns whose prompt+completion ends exactly here


@dataclass(frozen=True, slots=True)
class Match:
    """Where the longest inserted sequence that prefixes a query ends: turn id, its length, its tree position."""

    turn: int | None
    length: int
    edge: _Edge


class PrefixIndex:
    """Radix tree over the prompt+completion token sequences of a session's turns.

    `steps` counts tree nodes visited and `compared` counts tokens compared, over the index's life, so tests can
    check that linking work does not depend on how many turns came before."""

    def __init__(self) -> None:
        self.root = _Edge(array(TOKEN_TYPE))
        self.steps = 0
        self.compared = 0

    def longest(self, query: array[int]) -> Match:
        """The longest inserted sequence that is a prefix of `query` (the most recent turn among equal ones)."""
        best, best_depth = self.root, 0  # the deepest point where a turn ends (a Match is made once, at the end)
        edge, depth, n = self.root, 0, len(query)
        steps = compared = 0
        while depth < n:
            child = edge.children.get(query[depth])
            steps += 1
            if child is None:
                break
            k = len(child.label)
            compared += min(k, n - depth)
            if depth + k > n or query[depth : depth + k] != child.label:
                break
            edge, depth = child, depth + k
            if edge.ends:
                best, best_depth = edge, depth
        self.steps += steps
        self.compared += compared
        return Match(best.ends[-1] if best.ends else None, best_depth, best)

    def insert(self, seq: array[int], turn: int, start: Match) -> None:
        """Insert `seq` (which starts with the sequence `start` matched) as the sequence of `turn`."""
        edge, pos, n = start.edge, start.length, len(seq)
        while pos < n:
            self.steps += 1
            child = edge.children.get(seq[pos])
            if child is None:
                leaf = _Edge(seq[pos:])
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
            middle = _Edge(label[:common])
            child.label = label[common:]
            middle.children[child.label[0]] = child
            edge.children[seq[pos]] = middle
            edge, pos = middle, pos + common
        edge.ends.append(turn)


def _common_prefix(label: array[int], seq: array[int], pos: int) -> int:
    """Length of the common prefix of `label` and seq[pos:], by halving with memcmp-speed slice compares."""
    hi = min(len(label), len(seq) - pos)
    if label[:hi] == seq[pos : pos + hi]:
        return hi
    lo = 0  # invariant: label[:lo] matches, label[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if label[lo:mid] == seq[pos + lo : pos + mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(slots=True)
class _Record:
    parent: int | None
    shared: int  # len(prompt+completion of parent)
    tail: array[int]  # prompt tokens after the parent's prompt+completion
    completion: array[int]
    logprobs: array[float]  # empty when not trainable
    meta: Turn  # the turn's scalar fields (token lists emptied)
    valid_ids: bool  # no negative id in prompt+completion
    children: list[int] = field(default_factory=list)


_EMPTY_LISTS: dict[str, list[int]] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}


class SessionGraph:
    """The call graph of one session. Not thread-safe: one owner adds turns (the proxy serialises per session)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.index = PrefixIndex()
        self._records: list[_Record] = []
        self.tool_calls = 0
        self.untrainable = 0

    def __len__(self) -> int:
        return len(self._records)

    # ------------------------------------------------------------------ building

    def add(self, turn: Turn) -> Node:
        """Link `turn` to its parent and record it. Costs O(prompt length + completion length)."""
        prompt = as_tokens(turn.prompt_ids)
        completion = as_tokens(turn.completion_ids)
        match = self.index.longest(prompt)
        tail = prompt[match.length :]
        # The matched prefix is the parent's prompt+completion: if those were all valid ids, only new ones are
        # checked, so a long prompt costs nothing here beyond its new tokens.
        parent_valid = match.turn is not None and self._records[match.turn].valid_ids
        trainable = turn.trainable and not capture_problems(turn, match.length if parent_valid else 0)
        turn_id = len(self._records)
        record = _Record(
            parent=match.turn,
            shared=match.length,
            tail=tail,
            completion=completion,
            logprobs=array(LOGPROB_TYPE, turn.logprobs) if trainable else array(LOGPROB_TYPE),
            meta=turn.model_copy(update={**_EMPTY_LISTS, "trainable": trainable}),
            valid_ids=(parent_valid or match.length == 0) and not has_negative(tail) and not has_negative(completion),
        )
        self._records.append(record)
        if match.turn is not None:
            self._records[match.turn].children.append(turn_id)
        self.index.insert(prompt + completion, turn_id, match)
        self.tool_calls += turn.tool_calls
        self.untrainable += not trainable
        return Node(id=turn_id, parent=match.turn, shared_prefix=match.length, turn=turn)

    # ------------------------------------------------------------------ journal form

    def delta(self, turn_id: int) -> TurnDelta:
        """The turn as the journal stores it: only the tokens beyond its parent's prompt+completion."""
        r = self._record(turn_id)
        meta = r.meta.model_dump(exclude={"prompt_ids", "completion_ids", "logprobs"})
        return TurnDelta(
            id=turn_id,
            parent=r.parent,
            prompt_tail=r.tail.tolist(),
            completion_ids=r.completion.tolist(),
            logprobs=r.logprobs.tolist(),
            **meta,
        )

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
        out = array(TOKEN_TYPE)
        *ancestors, last = self.path(turn_id)
        for i in ancestors:
            out += self._records[i].tail
            out += self._records[i].completion
        out += self._records[last].tail
        return out

    def sequence_tokens(self, turn_id: int) -> array[int]:
        """prompt + completion of a turn, as an int32 array (no Python int per token)."""
        out = self.prompt_tokens(turn_id)
        out += self._records[turn_id].completion
        return out

    def prompt_ids(self, turn_id: int) -> list[int]:
        return self.prompt_tokens(turn_id).tolist()

    def sequence_ids(self, turn_id: int) -> list[int]:
        """prompt + completion of a turn."""
        return self.sequence_tokens(turn_id).tolist()

    def node(self, turn_id: int) -> Node:
        r = self._record(turn_id)
        turn = r.meta.model_copy(
            update={
                "prompt_ids": self.prompt_ids(turn_id),
                "completion_ids": r.completion.tolist(),
                "logprobs": r.logprobs.tolist(),
            }
        )
        return Node(id=turn_id, parent=r.parent, shared_prefix=r.shared, turn=turn)

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
            tokens, mask, logprobs, versions = array(TOKEN_TYPE), array("b"), array(LOGPROB_TYPE), array("q")
            path = self.path(leaf)
            for i in path:
                r = self._records[i]
                version = r.meta.policy_version
                n_tail, n_out = len(r.tail), len(r.completion)
                train = r.meta.trainable and i not in trained
                trained.add(i)
                tokens += r.tail + r.completion
                mask += array("b", [0]) * n_tail + array("b", [1 if train else 0]) * n_out
                logprobs += array(LOGPROB_TYPE, [0.0]) * n_tail
                logprobs += r.logprobs if train else array(LOGPROB_TYPE, [0.0]) * n_out
                versions += array("q", [version]) * (n_tail + n_out)
            sequences.append(
                TrainingSequence(
                    session_id=self.session_id,
                    node_ids=path,
                    token_ids=tokens.tolist(),
                    loss_mask=mask.tolist(),
                    logprobs=logprobs.tolist(),
                    policy_versions=versions.tolist(),
                    tool_calls=sum(self._records[i].meta.tool_calls for i in path),
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
