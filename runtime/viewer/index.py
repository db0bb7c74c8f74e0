"""The viewer's index of a run directory, built lazily and brought up to date on each request.

A run directory holds what the viewer shows in three files, all appended to while the run goes on:
  checkpoints/journal.jsonl   the coordinator's journal: every accepted completion (outcome, grader output) and,
                              for a scored training rollout, its training sequences (runtime/coordinator/journal.py)
  journal/*.jsonl             the proxy's journal: each session (its rollout, task, harness, group) and its calls
                              in order, each with the turn it captured (runtime/proxy/sessions.py)
  checkpoints/metrics.jsonl   one StepMetrics per learner step (runtime/learner/metrics.py)
The index keeps one small row per rollout and the byte offsets of its records, so a list page never parses a
training sequence and a rollout page reads only its own records. Each refresh reads only what was appended
since the last one (files.Tail). A refresh that took long is saved beside the journals (RUN_DIR/viewer/
index.json), and the next viewer of the run starts from it and reads only what came after.
"""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harnessrl.runtime.contracts.coordinator import SCORED_OUTCOMES, OutcomeKind
from harnessrl.runtime.contracts.learner_config import GrpoConfig, RewardConfig
from harnessrl.runtime.coordinator.journal import JournalEntry
from harnessrl.runtime.learner.evaluation import is_eval_rollout
from harnessrl.runtime.learner.metrics import StepMetrics
from harnessrl.runtime.learner.reward import group_advantages, reward
from harnessrl.runtime.trajectory.models import BreakCause
from harnessrl.runtime.viewer.files import Tail, read_line
from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)


class _CompletionHead(BaseModel):
    """The fields of a journaled completion a list row needs (the rest of the record is skipped)."""

    rollout_id: str
    session_id: str | None = None
    outcome: OutcomeKind
    correctness: float = 0.0
    tool_calls: int = 0
    unknown_tool_calls: int = 0
    invalid_tool_calls: int = 0
    prefix_breaks: dict[BreakCause, int] = {}


class _EntryHead(BaseModel):
    seq: int
    harness: str = ""
    completion: _CompletionHead


# A journal record is `seq`, `harness`, `completion`, then `sequences` (JournalEntry's field order), and its
# training sequences are nearly all of its bytes. A list row needs none of them, so it is parsed from the text
# before them: the first `,"sequences":` is that field's key, since a quote inside a JSON string is escaped and no
# key of a completion has that name. A record where it is not found is parsed whole.
_SEQUENCES_KEY = b',"sequences":'


def entry_head(line: bytes) -> _EntryHead:
    cut = line.find(_SEQUENCES_KEY)
    return _EntryHead.model_validate_json(line[:cut] + b"}" if cut > 0 else line)


class _SessionHead(BaseModel):
    """A proxy `session` record's request, as far as the viewer uses it."""

    rollout_id: str
    task_id: str
    harness: str
    group_id: str


class _TurnHead(BaseModel):
    policy_version: int = 0


class _ProxyRecord(BaseModel):
    """A proxy journal record, as far as the index uses it (pydantic-core skips the rest of it unparsed into
    Python objects, several times faster than the standard library's json for these records)."""

    k: str
    sid: str | None = None
    req: _SessionHead | None = None
    turn: _TurnHead | None = None


class RolloutRow(BaseModel):
    """One rollout as the list shows it. `version`: the oldest policy version that sampled it (None before the
    index has seen any of its tokens); `advantage`: its group's advantage as the learner computes it from the
    rewards of the group's scored rollouts (learner/reward.py; under `scale_rewards: batch` before the batch's
    scaling, which depends on the step's other groups)."""

    seq: int
    rollout_id: str
    harness: str
    task_id: str = ""
    group_id: str = ""
    session_id: str | None = None
    evaluation: bool
    outcome: OutcomeKind
    solved: bool
    scored: bool
    reward: float | None
    advantage: float | None = None
    correctness: float
    tool_calls: int
    unknown_tool_calls: int = 0  # of its tool calls, to a tool its call did not offer
    invalid_tool_calls: int = 0  # and against the tool's argument schema
    prefix_breaks: dict[BreakCause, int] = {}  # its calls that started one more training sequence, by cause
    version: int | None = None


class _Session(BaseModel):
    head: _SessionHead
    calls: list[tuple[str, int]] = []  # where each call record starts: (proxy journal file name, offset)
    min_version: int | None = None


class _Snapshot(BaseModel):
    """The index as saved beside the journals (SNAPSHOT): what it read of each file, by name, as (offset, inode),
    and what it built from it. Taken again only where it is of this FORMAT, every file is still the one it read
    (the same inode, no shorter) and the rewards were computed the same way; else the index is built anew."""

    format: int = 1  # FORMAT when saved: rows of another format lack fields or mean others
    scoring: str  # the reward and GRPO configs the rows' rewards and advantages come from
    journal: tuple[int, int | None]
    proxy: dict[str, tuple[int, int | None]]
    rows: list[RolloutRow]
    offsets: dict[str, int]
    sessions: dict[str, _Session]


SNAPSHOT = Path("viewer") / "index.json"
# The saved index's format: one more whenever a row gains a field (2: tool mismatches and prefix breaks).
FORMAT = 2
# A refresh that took this long is saved, so that the next viewer of the run starts from it.
SAVE_AFTER_S = 0.5


@contextmanager
def _collector_held() -> Iterator[None]:
    """The index's rows and sessions live as long as the viewer, and the collector would walk them over and over
    while they are made (hundreds of thousands of objects for a large run): it waits meanwhile. A long build is
    then frozen out of later collections (`gc.freeze`, as the proxy does its sessions: gc_policy.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_config(run_dir: Path, name: str) -> dict[str, object]:
    """A component's config as `harnessrl run` wrote it (RUN_DIR/config/NAME.json), or {} without one."""
    path = run_dir / "config" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


class RunIndex:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        learner = read_config(run_dir, "learner")
        self.reward_config = RewardConfig.model_validate(learner.get("reward", {}))
        self.grpo = GrpoConfig.model_validate(learner.get("grpo", {}))
        self.journal = Tail(run_dir / "checkpoints" / "journal.jsonl")
        self.metrics_tail = Tail(run_dir / "checkpoints" / "metrics.jsonl")
        self.proxy_tails: dict[str, Tail] = {}
        self.rows: dict[str, RolloutRow] = {}
        self.offsets: dict[str, int] = {}  # rollout id -> where its coordinator journal record starts
        self.sessions: dict[str, _Session] = {}
        self.metrics: list[StepMetrics] = []
        self._rollout_of: dict[str, str] = {}  # session id -> rollout id
        self._groups: dict[str, list[str]] = defaultdict(list)
        self._regroup: set[str] = set()  # groups that gained a rollout since their advantages were computed
        self._lock = threading.Lock()
        with _collector_held():
            self._load()
        gc.freeze()

    def _scoring(self) -> str:
        return self.reward_config.model_dump_json() + self.grpo.model_dump_json()

    def _load(self) -> None:
        """Start from the saved snapshot where it still holds."""
        path = self.run_dir / SNAPSHOT
        try:
            snap = _Snapshot.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValidationError) as exc:
            log.warning("harnessrl view: ignoring the index at %s (%s); building it anew", path, exc)
            return
        journal = Tail(self.journal.path, *snap.journal)
        proxy = {name: Tail(self.run_dir / "journal" / name, *state) for name, state in snap.proxy.items()}
        if snap.format != FORMAT or snap.scoring != self._scoring() or not all(t.unchanged() for t in [journal, *proxy.values()]):
            return
        self.journal, self.proxy_tails, self.offsets, self.sessions = journal, proxy, snap.offsets, snap.sessions
        for row in snap.rows:
            self.rows[row.rollout_id] = row
            if row.session_id:
                self._rollout_of[row.session_id] = row.rollout_id
            if row.group_id and not row.evaluation:
                self._groups[row.group_id].append(row.rollout_id)

    def save(self) -> None:
        """Write the snapshot (a temporary file renamed over it). A run directory the viewer may not write to
        keeps none: each viewer then builds the index anew."""
        snap = _Snapshot(format=FORMAT, scoring=self._scoring(), journal=(self.journal.offset, self.journal.inode),
                         proxy={name: (t.offset, t.inode) for name, t in self.proxy_tails.items()},
                         rows=list(self.rows.values()), offsets=self.offsets, sessions=self.sessions)
        path = self.run_dir / SNAPSHOT
        try:
            path.parent.mkdir(exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(snap.model_dump_json().encode())
            tmp.replace(path)
        except OSError as exc:
            log.warning("harnessrl view: could not save its index to %s: %s", path, exc)

    def refresh(self) -> list[RolloutRow]:
        """Take in whatever the run appended since the last refresh (a long one is saved: SAVE_AFTER_S), and
        return the rows as they are now: a list of its own, which a later refresh on another thread leaves be."""
        started = time.monotonic()
        with self._lock, _collector_held():
            for path in sorted((self.run_dir / "journal").glob("*.jsonl")):
                self._read_proxy(self.proxy_tails.setdefault(path.name, Tail(path)))
            self._read_journal()
            for group in self._regroup:
                self._advantages(group)
            self._regroup.clear()
            if self.metrics_tail.rewound():
                self.metrics = []
            # A new list: a page on another thread may be reading the one it got.
            self.metrics = [*self.metrics,
                            *(StepMetrics.model_validate_json(line) for _, line in self.metrics_tail.new_lines())]
            if time.monotonic() - started > SAVE_AFTER_S:
                gc.freeze()
                self.save()
            return list(self.rows.values())

    def _read_proxy(self, tail: Tail) -> None:
        if tail.rewound():
            for session in self.sessions.values():
                session.calls = [c for c in session.calls if c[0] != tail.path.name]
        for offset, line in tail.new_lines():
            record = _ProxyRecord.model_validate_json(line)
            if record.sid is None:
                continue
            if record.k == "session" and record.req is not None:
                self.sessions.setdefault(record.sid, _Session(head=record.req))
            elif record.k == "call" and (found := self.sessions.get(record.sid)) is not None:
                found.calls.append((tail.path.name, offset))
                if record.turn is not None:
                    self._sampled(record.sid, found, record.turn.policy_version)

    def _sampled(self, sid: str, session: _Session, version: int) -> None:
        """A turn of `session` sampled by `version`: its rollout's row shows the oldest version."""
        if session.min_version is not None and session.min_version <= version:
            return
        session.min_version = version
        if (rollout_id := self._rollout_of.get(sid)) is not None:
            self._join(self.rows[rollout_id])

    def _read_journal(self) -> None:
        if self.journal.rewound():
            self.rows.clear()
            self.offsets.clear()
            self._groups.clear()
            self._regroup.clear()
            self._rollout_of.clear()
        for offset, line in self.journal.new_lines():
            head = entry_head(line)
            c = head.completion
            r = reward(c.outcome, c.correctness, c.tool_calls, self.reward_config,
                       c.unknown_tool_calls + c.invalid_tool_calls)
            row = RolloutRow(seq=head.seq, rollout_id=c.rollout_id, harness=head.harness, session_id=c.session_id,
                             evaluation=is_eval_rollout(c.rollout_id), outcome=c.outcome,
                             solved=c.outcome == OutcomeKind.solved, scored=c.outcome in SCORED_OUTCOMES, reward=r,
                             correctness=c.correctness, tool_calls=c.tool_calls,
                             unknown_tool_calls=c.unknown_tool_calls, invalid_tool_calls=c.invalid_tool_calls,
                             prefix_breaks=c.prefix_breaks)
            self.rows[c.rollout_id] = row
            self.offsets[c.rollout_id] = offset
            if c.session_id:
                self._rollout_of[c.session_id] = c.rollout_id
            self._join(row)

    def _join(self, row: RolloutRow) -> None:
        """Fill in what only the proxy's session record knows: the task, the group, the versions sampled; a
        training rollout's group then gets its advantages again."""
        session = self.sessions.get(row.session_id or "")
        if session is None:
            return
        row.version = session.min_version
        if row.group_id:
            return
        row.task_id, row.group_id = session.head.task_id, session.head.group_id
        if not row.evaluation:
            self._groups[row.group_id].append(row.rollout_id)
            self._regroup.add(row.group_id)

    def _advantages(self, group: str) -> None:
        scored = [self.rows[r] for r in self._groups[group] if self.rows[r].reward is not None]
        advantages = group_advantages([r.reward for r in scored if r.reward is not None], self.grpo.adv_epsilon,
                                      self.grpo.scale_rewards)
        for row, a in zip(scored, advantages or [0.0] * len(scored), strict=True):
            row.advantage = a

    def entry(self, rollout_id: str) -> JournalEntry | None:
        """A rollout's full coordinator journal record, read from its offset."""
        offset = self.offsets.get(rollout_id)
        if offset is None:
            return None
        return JournalEntry.model_validate_json(read_line(self.journal.path, offset))

    def calls(self, session_id: str | None) -> list[dict[str, object]]:
        """A session's proxy call records, in the order the harness made them ([] once compaction dropped them)."""
        session = self.sessions.get(session_id or "")
        if session is None:
            return []
        return [json.loads(read_line(self.run_dir / "journal" / name, offset)) for name, offset in session.calls]
