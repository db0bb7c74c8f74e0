"""The coordinators' journal (runtime/coordinator/journal.py): one crash behaviour. A torn last line (no newline:
what a kill during the write leaves) is cut off and logged with the file and byte offset, the rest replays; a
line that does not parse anywhere else is damage, not a crash, and replay refuses it naming the file and line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from harnessrl.runtime.contracts.coordinator import Completion, OutcomeKind
from harnessrl.runtime.coordinator.journal import Journal, JournalCorrupt, JournalEntry, read_entries
from harnessrl.runtime.trajectory.models import TrainingSequence


def entry(seq: int, tokens: int = 2) -> JournalEntry:
    c = Completion(rollout_id=f"g{seq:07d}-r000", lease_id=f"g{seq:07d}-r000.a1-0", outcome=OutcomeKind.solved)
    seq_tokens = TrainingSequence(session_id="s", node_ids=[0], token_ids=[7] * tokens, loss_mask=[1] * tokens,
                                  logprobs=[-0.5] * tokens, policy_versions=[0] * tokens)
    return JournalEntry(seq=seq, harness="mini", completion=c, sequences=[seq_tokens])


def written(path: Path, n: int, tokens: int = 2) -> bytes:
    j = Journal(path, fsync=True)
    for i in range(1, n + 1):
        j.append(entry(i, tokens))
    j.close()
    return path.read_bytes()


def test_appends_replay_in_order_and_after_a_seq(tmp_path: Path) -> None:
    path = tmp_path / "j" / "journal.jsonl"
    written(path, 3)
    j = Journal(path)
    assert [e.seq for e in j.entries()] == [1, 2, 3]
    assert [e.completion.rollout_id for e in j.entries_after(1)] == ["g0000002-r000", "g0000003-r000"]
    assert list(j.entries()) == [entry(1), entry(2), entry(3)]
    j.close()


@pytest.mark.parametrize("tokens", [2, 40_000])  # a record far longer than the block the tail is searched in
def test_a_torn_last_line_is_dropped_logged_and_the_rest_replays(tmp_path: Path, tokens: int,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "journal.jsonl"
    whole = written(path, 2, tokens)
    torn = entry(3, tokens).model_dump_json().encode()
    path.write_bytes(whole + torn[: len(torn) // 2])
    with caplog.at_level(logging.WARNING, logger="harnessrl.runtime.coordinator.journal"):
        j = Journal(path)
    assert caplog.messages == [f"journal {path}: dropped a torn last record at byte {len(whole)} "
                               f"({len(torn) // 2} bytes, never acknowledged)"]
    assert path.read_bytes() == whole and [e.seq for e in j.entries()] == [1, 2]
    j.append(entry(3, tokens))  # goes on after the last whole record, on a line of its own
    j.close()
    assert [e.seq for e in Journal(path).entries()] == [1, 2, 3]


def test_a_reader_skips_a_torn_last_line_and_changes_nothing(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "journal.jsonl"
    whole = written(path, 2)
    path.write_bytes(whole + b'{"seq":3,"har')
    with caplog.at_level(logging.WARNING):
        assert [e.seq for e in read_entries(path)] == [1, 2]
    assert caplog.messages == [f"journal {path}: ignoring a torn last record at byte {len(whole)} (13 bytes)"]
    assert path.read_bytes() == whole + b'{"seq":3,"har'


def test_a_single_torn_record_leaves_an_empty_journal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b'{"seq":1,"harn')
    with caplog.at_level(logging.WARNING):
        j = Journal(path)
    assert "dropped a torn last record at byte 0 (14 bytes" in caplog.text
    assert path.read_bytes() == b"" and list(j.entries()) == []


def test_a_whole_journal_opens_without_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "journal.jsonl"
    whole = written(path, 2)
    with caplog.at_level(logging.WARNING):
        Journal(path).close()
    assert path.read_bytes() == whole and caplog.messages == []


@pytest.mark.parametrize("at", [1, 2, 3])  # first, middle, last: a whole line is never a torn write
@pytest.mark.parametrize("bad", [b'{"seq": 2, "completion": "not a completion"}', b"}{\xff not json", b""])
def test_a_corrupt_whole_line_fails_loudly_with_file_and_line(tmp_path: Path, at: int, bad: bytes) -> None:
    path = tmp_path / "journal.jsonl"
    lines = written(path, 3).splitlines(keepends=True)
    lines[at - 1] = bad + b"\n"
    damaged = b"".join(lines)
    path.write_bytes(damaged)
    j = Journal(path)
    with pytest.raises(JournalCorrupt, match=rf"journal {path}, line {at}: not a record"):
        list(j.entries())
    with pytest.raises(JournalCorrupt, match=rf"line {at}: not a record"):
        list(read_entries(path))
    assert path.read_bytes() == damaged  # nothing cut: what to do with it is the operator's call
