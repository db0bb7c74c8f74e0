"""Capture of a call (stream and whole) and the journal's durability, torn-tail and compaction behaviour."""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
import time
from pathlib import Path

import pytest
from harnessrl.runtime.contracts.proxy import CreateSessionRequest
from harnessrl.runtime.proxy import journal as journal_module
from harnessrl.runtime.proxy.capture import CallCapture
from harnessrl.runtime.proxy.dialects.base import completion_as_chunks
from harnessrl.runtime.proxy.dialects.upstream import (
    STREAM_CHUNK,
    Choice,
    ChoiceLogprobs,
    Completion,
    CompletionChunk,
    FunctionCallDelta,
    TokenLogprob,
    UpstreamMessage,
    UpstreamToolCall,
)
from harnessrl.runtime.proxy.journal import INLINE_SYNC_MAX_S, Journal, read_records
from harnessrl.runtime.proxy.sessions import Session, SessionStore
from harnessrl.runtime.trajectory.models import TurnDelta, capture_problems

from tests.waiting import wait_until_async


def _completion(logprobs: list[float]) -> Completion:
    call = UpstreamToolCall(id="call_1", index=0, function=FunctionCallDelta(name="bash", arguments="{}"))
    return Completion(
        prompt_token_ids=[1, 2, 3],
        choices=[
            Choice(
                message=UpstreamMessage(role="assistant", content="ok", tool_calls=[call]),
                token_ids=[7, 8, 9],
                logprobs=ChoiceLogprobs(content=[TokenLogprob(logprob=lp) for lp in logprobs]),
                finish_reason="tool_calls",
            )
        ],
    )


def _chunks(completion: Completion) -> list[CompletionChunk]:
    """vLLM-style stream of a completion, as the proxy parses it off the wire: prompt ids first, one token
    (id + logprob) per chunk."""
    choice = completion.choices[0]
    assert choice.logprobs is not None
    chunks = [{"prompt_token_ids": completion.prompt_token_ids,
               "choices": [{"delta": {"role": "assistant", "content": ""}}]}]
    for i, (tid, lp) in enumerate(zip(choice.token_ids or [], choice.logprobs.content or [], strict=True)):
        delta = choice.message.model_dump(include={"tool_calls"}) if i == 0 else {"content": "x"}
        chunks.append({"choices": [{"delta": delta, "token_ids": [tid], "logprobs": {"content": [dict(lp)]}}]})
    chunks.append({"choices": [{"finish_reason": choice.finish_reason}]})
    chunks.append({"choices": []})
    return [STREAM_CHUNK.validate_python(chunk) for chunk in chunks]


def test_stream_capture_equals_whole_capture() -> None:
    completion = _completion([-0.5, -1.0, -0.01])
    whole = CallCapture.from_completion(completion)
    streamed = CallCapture()
    for chunk in _chunks(completion):
        streamed.feed(chunk)
    for capture in (whole, streamed):
        turn = capture.to_turn(model="tiny", policy_version=2, started_at=1.0, finished_at=2.0)
        assert capture_problems(turn) == []
        assert (turn.prompt_ids, turn.completion_ids, turn.logprobs) == ([1, 2, 3], [7, 8, 9], [-0.5, -1.0, -0.01])
        assert (turn.finish_reason, turn.tool_calls, turn.policy_version, turn.trainable) == ("tool_calls", 1, 2, True)


def _session() -> Session:
    store = SessionStore(default_budget=10, ttl_s=60)
    return store.create(CreateSessionRequest(rollout_id="r", task_id="t", harness="h", group_id="g"))[0]


def test_invalid_capture_is_kept_as_context_only_and_counted() -> None:
    session = _session()
    good = CallCapture.from_completion(_completion([-0.1, -0.1, -0.1]))
    session.record_call(answered=True, turn=good.to_turn(model="t", policy_version=0, started_at=0, finished_at=0))
    for logprobs in ([-0.5, 0.3, -1.0], [-0.5, -math.inf, -1.0], [-0.5, -1.0]):
        capture = CallCapture.from_completion(_completion([-0.1, -0.1, -0.1]))
        capture.logprobs = logprobs
        record = session.record_call(
            answered=True, turn=capture.to_turn(model="t", policy_version=0, started_at=0, finished_at=0)
        )
        assert record["turn"]["trainable"] is False and "kept as context only" in record["error"]
    info = session.info()
    assert (info.turns, info.bad_turns, len(info.errors)) == (4, 3, 3)
    (trained,) = [s for s in session.sequences().sequences if sum(s.loss_mask)]
    assert trained.node_ids == [0]  # only the valid turn's samples are trained


def test_replaying_the_records_rebuilds_the_same_session() -> None:
    live = _session()
    records = []
    prompt = [1, 2, 3]
    for i in range(4):
        completion = _completion([-0.1, -0.2, -0.3]).model_copy(update={"prompt_token_ids": prompt})
        turn = CallCapture.from_completion(completion).to_turn(model="t", policy_version=i, started_at=i, finished_at=i)
        records.append(live.record_call(answered=True, turn=turn, at=float(i)))
        prompt = [*prompt, 7, 8, 9, 100 + i]
    # Prefix de-duplication: each later record stores only the new prompt token.
    assert [len(TurnDelta.model_validate(r["turn"]).prompt_tail) for r in records] == [3, 1, 1, 1]
    rebuilt = Session(id=live.id, request=live.request, call_budget=live.call_budget, created_at=live.created_at,
                      last_activity_at=live.created_at)
    for record in records:
        rebuilt.replay_call(json.loads(json.dumps(record)))
    assert rebuilt.info() == live.info()
    assert rebuilt.sequences() == live.sequences()


async def test_completion_as_chunks_round_trips_through_capture() -> None:
    completion = _completion([-0.1, -0.2, -0.3])
    capture = CallCapture()
    async for chunk in completion_as_chunks(completion):
        capture.feed(chunk)
    assert capture.finish_reason == "tool_calls" and capture.tool_calls == 1


async def test_journal_appends_durably_and_compacts(tmp_path: Path) -> None:
    path = tmp_path / "j" / "proxy-0.jsonl"
    journal = Journal(path, fsync=True)
    try:
        await asyncio.gather(*(journal.append({"k": "call", "sid": f"s{i % 3}", "n": i}) for i in range(200)))
        records = list(read_records(path))
        assert [r["n"] for r in records] == list(range(200))  # order kept across group commits
        assert journal.commits < 200  # records were grouped
        await journal.compact(lambda r: r["sid"] == "s1")
        await journal.append({"k": "call", "sid": "s1", "n": 999})
        assert [r["n"] for r in read_records(path)] == [*range(1, 200, 3), 999]
    finally:
        journal.close()


async def test_appends_made_while_a_compaction_runs_land_after_it(tmp_path: Path) -> None:
    path = tmp_path / "proxy-0.jsonl"
    journal = Journal(path, fsync=True)
    try:
        await asyncio.gather(*(journal.append({"sid": f"s{i % 2}", "n": i}) for i in range(10)))
        compaction = journal.compact(lambda r: r["sid"] == "s0")
        during = [journal.append({"sid": "s0", "n": 100 + i}) for i in range(3)]  # buffered until it is done
        await asyncio.gather(compaction, *during)
        assert [r["n"] for r in read_records(path)] == [0, 2, 4, 6, 8, 100, 101, 102]
        await journal.append({"sid": "s0", "n": 200})  # the journal goes on in the new file
        assert [r["n"] for r in read_records(path)][-1] == 200
        assert not path.with_suffix(".jsonl.compact").exists()
    finally:
        journal.close()


async def test_a_failed_write_fails_the_waiting_calls(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "proxy-0.jsonl", fsync=True)
    os.close(journal._fd)  # the disk is gone: every write fails with EBADF
    journal._fd = os.open(os.devnull, os.O_RDONLY)
    try:
        results = await asyncio.gather(journal.append({"n": 1}), journal.append({"n": 2}), return_exceptions=True)
        assert all(isinstance(r, OSError) for r in results)
    finally:
        journal.close()


async def test_a_failed_fsync_fails_the_calls_it_covered_and_the_journal_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = [True]

    def fdatasync(fd: int) -> None:
        if failing[0]:
            raise OSError(5, "Input/output error")
        os.fsync(fd)

    monkeypatch.setattr(journal_module, "PREFILL_BYTES", 0)  # only the commits' syncs
    monkeypatch.setattr(journal_module.os, "fdatasync", fdatasync)
    journal = Journal(tmp_path / "proxy-0.jsonl", fsync=True)
    try:
        results = await asyncio.gather(journal.append({"n": 1}), journal.append({"n": 2}), return_exceptions=True)
        assert all(isinstance(r, OSError) for r in results)
        failing[0] = False  # the disk is back: the next record is synced
        await journal.append({"n": 3})
        assert [r["n"] for r in read_records(journal.path)] == [1, 2, 3]  # written, not known to be durable
    finally:
        journal.close()


async def test_a_slow_fsync_moves_the_next_ones_off_the_loop_until_one_is_fast_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the disk is fast a commit's fsync runs on the loop's thread; after one that took longer than
    INLINE_SYNC_MAX_S they run in the helper thread, until one there is fast again."""
    synced_on: list[str] = []
    slow = [True]

    def fdatasync(fd: int) -> None:
        synced_on.append(threading.current_thread().name)
        if slow[0]:
            time.sleep(INLINE_SYNC_MAX_S * 2)
        os.fsync(fd)

    monkeypatch.setattr(journal_module, "PREFILL_BYTES", 0)  # only the commits' syncs
    monkeypatch.setattr(journal_module.os, "fdatasync", fdatasync)
    loop_thread = threading.current_thread().name
    journal = Journal(tmp_path / "proxy-0.jsonl", fsync=True)
    try:
        await journal.append({"n": 1})  # on the loop, and slow
        assert synced_on == [loop_thread] and not journal.sync_inline
        await journal.append({"n": 2})  # in the helper thread, slow again
        slow[0] = False
        await journal.append({"n": 3})  # still in the helper thread, fast this time
        assert synced_on[1:] == ["proxy-journal_0"] * 2 and journal.sync_inline
        await journal.append({"n": 4})  # back on the loop
        assert synced_on[3:] == [loop_thread]
        assert [r["n"] for r in read_records(journal.path)] == [1, 2, 3, 4]
    finally:
        journal.close()


async def test_a_held_commit_waits_for_the_calls_in_flight_and_one_fsync_covers_them(tmp_path: Path) -> None:
    """Group commit (`hold_commits`): with three calls in flight, the first two records wait (written, not yet
    synced) for the third, however long the delay; then one fsync releases all three."""
    journal = Journal(tmp_path / "proxy-0.jsonl", fsync=True)
    journal.hold_commits(60.0, lambda: 3)
    try:
        first = [journal.append({"n": 1}), journal.append({"n": 2})]
        # Written (a killed process keeps them), and still not synced nor released.
        await wait_until_async(lambda: [r["n"] for r in read_records(journal.path)] == [1, 2], 5, "both records written")
        assert not any(f.done() for f in first) and journal.commits == 0
        await asyncio.wait_for(asyncio.gather(*first, journal.append({"n": 3})), timeout=5)
        assert journal.commits == 1
    finally:
        journal.close()


async def test_a_held_commit_runs_when_its_delay_is_over(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "proxy-0.jsonl", fsync=True)
    journal.hold_commits(0.2, lambda: 5)  # four other calls in flight that never append
    try:
        started = time.perf_counter()
        await asyncio.wait_for(journal.append({"n": 1}), timeout=5)
        assert time.perf_counter() - started >= 0.19 and journal.commits == 1
        journal.hold_commits(60.0, lambda: 1)  # only the appending call itself in flight: nothing to wait for
        await asyncio.wait_for(journal.append({"n": 2}), timeout=5)
        assert journal.commits == 2
    finally:
        journal.close()


async def test_closing_syncs_what_a_held_commit_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(journal_module, "PREFILL_BYTES", 0)
    monkeypatch.setattr(journal_module.os, "fsync", lambda fd: synced.append(fd))
    journal = Journal(tmp_path / "proxy-0.jsonl", fsync=True)
    journal.hold_commits(60.0, lambda: 2)
    journal.append({"n": 1})
    await wait_until_async(lambda: [r["n"] for r in read_records(journal.path)] == [1], 5, "the record written")
    assert synced == []
    journal.close()
    assert len(synced) == 1 and [r["n"] for r in read_records(journal.path)] == [1]


async def test_the_file_is_zero_filled_ahead_of_its_records_and_a_clean_close_trims_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "PREFILL_BYTES", 1 << 16)
    path = tmp_path / "proxy-0.jsonl"
    journal = Journal(path, fsync=True)
    records = [{"n": i, "pad": "x" * 1000} for i in range(200)]  # ~200 KB: three stretches filled
    try:
        for record in records:
            await journal.append(record)
        end = sum(len(Journal.encode(r)) for r in records)
        for _ in range(500):  # the last stretch's fill, in the helper thread
            if path.stat().st_size >= end + (1 << 15):
                break
            await asyncio.sleep(0.01)
        data = path.read_bytes()
        assert len(data) >= end + (1 << 15) and not data[end:].strip(b"\0") and data[end - 1 : end] == b"\n"
        assert list(read_records(path)) == records
    finally:
        journal.close()
    assert path.stat().st_size == end


async def test_a_journal_left_with_its_zero_tail_goes_on_where_its_records_end(tmp_path: Path) -> None:
    """A killed process leaves the filled tail: reopened, the journal appends right after its last record."""
    path = tmp_path / "proxy-0.jsonl"
    path.write_bytes(b'{"n": 1}\n' + bytes(200_000))
    journal = Journal(path, fsync=True)
    try:
        await journal.append({"n": 2})
        assert list(read_records(path)) == [{"n": 1}, {"n": 2}]
    finally:
        journal.close()
    assert path.read_bytes() == b'{"n": 1}\n{"n":2}\n'


async def test_records_past_the_filled_end_wait_for_the_fill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_module, "PREFILL_BYTES", 4096)
    release = threading.Event()
    fill = Journal._prefill

    filling = threading.Event()

    def held_fill(self: Journal, *args: object) -> None:
        filling.set()
        release.wait(10)
        fill(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Journal, "_prefill", held_fill)
    path = tmp_path / "proxy-0.jsonl"
    journal = Journal(path, fsync=True)
    try:
        await journal.append({"n": 1, "pad": "x" * 3000})  # the file's first stretch: its fill starts, and waits
        second = journal.append({"n": 2, "pad": "x" * 3000})  # would go past the filled end
        await wait_until_async(filling.is_set, 5, "the first stretch's fill to start")
        await asyncio.sleep(0)  # one loop turn: the flush that append scheduled (call_soon) has run
        assert not second.done() and [r["n"] for r in read_records(path)] == [1]
        release.set()
        await asyncio.wait_for(second, timeout=5)
        assert [r["n"] for r in read_records(path)] == [1, 2]
    finally:
        release.set()
        journal.close()


def test_read_records_skips_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_bytes(json.dumps({"a": 1}).encode() + b"\n" + b'{"a": 2, "b"')
    assert list(read_records(path)) == [{"a": 1}]


async def test_a_record_that_cannot_be_encoded_fails_alone(tmp_path: Path) -> None:
    """A bad record fails its own call; the records around it are still durable."""
    path = tmp_path / "proxy-0.jsonl"
    journal = Journal(path, fsync=False)
    try:
        results = await asyncio.gather(
            journal.append({"n": 1}), journal.append({"n": object()}), journal.append({"n": 3, "lp": -math.inf}),
            return_exceptions=True,
        )
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], Exception)
        assert list(read_records(path)) == [{"n": 1}, {"n": 3, "lp": -math.inf}]
    finally:
        journal.close()
