"""The proxy benchmark's pure parts: each dialect's request bodies are what the proxy's own dialect parsers
accept (with the history growing as the harness would send it), and the statistics are computed as documented."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from harnessrl.runtime.proxy.dialects.routes import dialect_for, match_route

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "proxy"))

from loadgen import LoadSpec
from proxy_waits import summarize_waits
from pyspy import summarize
from results import LevelResult, RunResults, TargetResult, add_baseline, percentile, render_markdown
from workload import (
    DIALECTS,
    TOOL_COMMAND,
    TOOL_NAME,
    Reply,
    ReplyError,
    SessionPlan,
    SessionWorkload,
    ToolCall,
    tool_output,
)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_bodies_parse_in_the_proxys_dialect_as_the_history_grows(dialect: str, stream: bool) -> None:
    work = SessionWorkload(dialect, stream, "key", "tiny")  # type: ignore[arg-type]
    output = tool_output(7, 500)
    for turn in range(3):
        request = work.request()
        path, _, query = request.path.partition("?")
        route = match_route(path, dict([query.split("=")]) if query else {})
        assert route is not None and route.dialect == dialect
        parsed = dialect_for(route).parse_request(request.body, route)
        assert parsed.stream == stream
        messages = parsed.canonical.upstream_body()["messages"]
        # system + task, then an assistant tool call and its tool result per earlier turn
        assert len(messages) == 2 + 2 * turn
        assert [t.function.name for t in parsed.canonical.tools or []] == [TOOL_NAME]
        if turn:
            assert messages[-2]["role"] == "assistant" and messages[-1]["role"] == "tool"
            assert json.loads(messages[-2]["tool_calls"][0]["function"]["arguments"]) == {"command": TOOL_COMMAND}
        if dialect == "anthropic":  # Claude Code's one sliding cache marker, on the newest message
            sent = json.loads(request.body)["messages"]
            marked = [i for i, m in enumerate(sent) for block in m["content"] if "cache_control" in block]
            assert marked == [len(sent) - 1]
        args = json.dumps({"command": TOOL_COMMAND})
        work.record_turn(Reply([ToolCall(f"call_{turn}", TOOL_NAME, args)]), output)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_sessions_can_send_as_many_tools_as_real_harnesses_do(dialect: str) -> None:
    request = SessionWorkload(dialect, False, "key", "tiny", tools=20).request()  # type: ignore[arg-type]
    path, _, query = request.path.partition("?")
    route = match_route(path, dict([query.split("=")]) if query else {})
    assert route is not None
    tools = dialect_for(route).parse_request(request.body, route).canonical.tools or []
    assert [t.function.name for t in tools] == [TOOL_NAME, *(f"tool_{i}" for i in range(1, 20))]
    assert 25_000 < len(request.body) < 60_000  # ~1.5 KB a tool, as a real harness's definitions


def test_tool_output_is_about_the_requested_tokens_and_deterministic() -> None:
    text = tool_output(3, 500)
    assert len(text.encode()) == 2000  # the stand-in's fast tokenizer: 4 bytes a token
    assert text == tool_output(3, 500) != tool_output(4, 500)


def test_a_reply_without_tool_call_is_an_error() -> None:
    work = SessionWorkload("anthropic", False, "key", "tiny")
    with pytest.raises(ReplyError):
        work.record_turn(Reply([]), "out")
    with pytest.raises(ReplyError):
        work.parse(b"<html>")


def test_stream_reader_needs_the_dialects_final_event() -> None:
    reader = SessionWorkload("anthropic", True, "key", "tiny").stream_reader()
    reader.feed(b'data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t1","name":"shell","input":{}}}')
    reader.feed(b'data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\\"a\\": 1}"}}')
    with pytest.raises(ReplyError, match="before its final event"):
        reader.finish()
    reader.feed(b'data: {"type":"message_stop"}')
    assert reader.finish().tool_calls == [ToolCall("t1", "shell", '{"a": 1}')]


def test_session_mix_covers_every_dialect_streamed_and_not_in_eight_sessions() -> None:
    plans = {(p.dialect, p.stream) for p in (SessionPlan.of(i, 0.5) for i in range(8))}
    assert plans == {(d, s) for d in DIALECTS for s in (False, True)}
    streamed = sum(SessionPlan.of(i, 0.5).stream for i in range(1000))
    assert 450 <= streamed <= 550


def test_pauses_are_fixed_by_default_and_spread_evenly_around_the_same_mean() -> None:
    fixed = LoadSpec(sessions=100, turns=20, pause_s=2.0)
    assert {fixed.pause(s, t) for s in range(100) for t in range(19)} == {2.0}
    spread = LoadSpec(sessions=1000, turns=20, pause_s=2.0, pause_spread=0.5)
    pauses = [spread.pause(s, t) for s in range(1000) for t in range(19)]
    assert min(pauses) >= 1.0 and max(pauses) <= 3.0
    assert abs(sum(pauses) / len(pauses) - 2.0) < 0.01
    # Even: each quarter of the range holds about a quarter of the pauses.
    quarters = [sum(1.0 + 0.5 * q <= p < 1.5 + 0.5 * q for p in pauses) / len(pauses) for q in range(4)]
    assert all(0.24 < share < 0.26 for share in quarters), quarters
    # Sessions do not pause in step: at one turn, the pauses of neighbouring sessions differ.
    assert len({round(spread.pause(s, 3), 6) for s in range(100)}) == 100
    assert spread.pause(7, 3) == spread.pause(7, 3)  # deterministic: two runs play the same load


def test_percentile_is_nearest_rank_and_added_latency_is_against_the_baseline() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0 and percentile([], 50) is None

    def target(name: str, p50: float, p99: float) -> TargetResult:
        return TargetResult(target=name, sessions=1, sessions_finished=1, calls_ok=1, errors=0, cut_at_deadline=0,
                            p50_ms=p50, p99_ms=p99, calls_per_s=1, wall_s=1, client_procs=1,
                            client_cpu_pct_max=0, client_lag_p99_ms=0)

    level = LevelResult(sessions=1, pause_s=2, turns=20,
                        targets=[target("baseline", 10, 100), target("harnessrl", 15, 180)])
    add_baseline(level)
    assert (level.targets[1].p50_added_ms, level.targets[1].p99_added_ms) == (5, 80)


def test_the_proxys_own_histograms_are_summarised_by_bucket_bounds_and_shown_under_the_level() -> None:
    from harnessrl.runtime.proxy.metrics import ProxyMetrics
    from prometheus_client import generate_latest

    metrics = ProxyMetrics()
    for seconds in [0.003] * 50 + [0.04] * 40 + [0.2] * 9 + [400.0]:
        metrics.upstream_latency.observe(seconds)
    waits = summarize_waits(generate_latest(metrics.registry).decode())
    assert list(waits) == ["engine call"]  # the journal histogram saw nothing: left out
    engine = waits["engine call"]
    assert engine.count == 100 and engine.mean_ms == pytest.approx(4035.5)
    assert (engine.p50_ms, engine.p90_ms, engine.p99_ms) == (5.0, 50.0, 250.0)
    metrics.journal_latency.observe(1000.0)  # beyond the top bucket
    assert summarize_waits(generate_latest(metrics.registry).decode())["journal"].p50_ms is None

    result = TargetResult(target="harnessrl", sessions=1, sessions_finished=1, calls_ok=1, errors=0,
                          cut_at_deadline=0, p50_ms=1, p99_ms=1, calls_per_s=1, wall_s=1, client_procs=1,
                          client_cpu_pct_max=0, client_lag_p99_ms=0, proxy_waits=waits)
    run = RunResults(command="run.py", started_at="t0", machine="m", load_before="0", proxy_config="{}",
                     levels=[LevelResult(sessions=1, pause_s=2, turns=20, targets=[result])])
    assert "- harnessrl: its own histograms: engine call mean 4035.5 ms (p50 ≤ 5, p90 ≤ 50, p99 ≤ 250 ms; 100 timed)." \
        in render_markdown(run)


def test_stage_breakdown_times_every_stage_of_every_session_mix() -> None:
    from stages import Clock, play

    clock = Clock()
    calls = play(clock, turns=2)
    assert calls == len(DIALECTS) * 2 * 2
    assert len(clock.ms) == 7 and all(ms > 0 for ms in clock.ms.values())  # stages 3 and 4 are one
    assert set(clock.calls_by_mix.values()) == {2} and len(clock.calls_by_mix) == 8


def test_stage_report_keeps_each_figures_lowest_over_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from stages import main

    assert main(["--turns", "2", "--repeat", "1", "--best-of", "2"]) == 0
    out = capsys.readouterr().out
    assert "lowest of 2 runs" in out
    rows = dict(line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith("| ") and "---" not in line)
    stages = {name: float(ms) for name, ms in rows.items() if name[0].isdigit()}
    assert len(stages) == 7 and all(ms > 0 for ms in stages.values())
    assert float(rows["total"]) >= max(stages.values())


ANSWERS = {
    "openai_chat": {
        "id": "x",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"command":"ls"}'}}]}}],
        "prompt_token_ids": list(range(5000)),
    },
    "openai_responses": {"output": [
        {"type": "message", "content": []},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"command":"ls"}'}]},
    "anthropic": {"content": [{"type": "text", "text": "ok"},
                              {"type": "tool_use", "id": "c1", "name": "shell", "input": {"command": "ls"}}]},
    "gemini": {"candidates": [{"content": {"parts": [{"text": "ok"},
                                                     {"functionCall": {"name": "shell", "args": {"command": "ls"}}}]}}]},
}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_answers_parse_to_their_tool_calls_and_bad_shapes_are_reply_errors(dialect: str) -> None:
    work = SessionWorkload(dialect, False, "key", "tiny")  # type: ignore[arg-type]
    [call] = work.parse(json.dumps(ANSWERS[dialect]).encode()).tool_calls
    assert (call.name, json.loads(call.arguments)) == ("shell", {"command": "ls"})
    assert call.id == ("call_1" if dialect == "gemini" else "c1")
    with pytest.raises(ReplyError, match="answer shape"):
        work.parse(b'{"choices": 5, "output": 5, "content": 5, "candidates": 5}')
    with pytest.raises(ReplyError, match="answer shape"):
        work.parse(b'{"choices": [], "output": [], "content": [], "candidates": []}' if dialect in
                   ("openai_chat", "gemini") else b"{}")


STREAMS = {
    "openai_chat": [
        b'data: {"choices":[{"delta":{"role":"assistant"}}],"prompt_token_ids":[1,2,3]}',
        b'data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"shell"}}]}}]}',
        b'data: {"choices":[{"delta":{}}]}',
        b'data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"a\\": 1}"}}]}}]}',
        b"data: [DONE]",
    ],
    "anthropic": [
        b"event: content_block_start",
        b'data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"c1","name":"shell","input":{}}}',
        b"event: content_block_delta",
        b'data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\\"a\\": 1}"}}',
        b'data: {"type":"message_stop"}',
    ],
    "openai_responses": [
        b'data: {"type":"response.output_item.done","item":{"type":"function_call","call_id":"c1","name":"shell","arguments":"{\\"a\\": 1}"}}',
        b'data: {"type":"response.completed"}',
    ],
    "gemini": [
        b'data: {"candidates":[{"content":{"parts":[{"functionCall":{"id":"c1","name":"shell","args":{"a":1}}}]}}]}',
        b'data: {"candidates":[{"finishReason":"STOP"}]}',
    ],
}


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_whole_stream_reads_as_its_lines_fed_one_by_one(dialect: str, newline: bytes) -> None:
    work = SessionWorkload(dialect, True, "key", "tiny")  # type: ignore[arg-type]
    lines = STREAMS[dialect]
    raw = newline.join(line + newline for line in lines)
    one_by_one = work.stream_reader()
    for line in lines:
        one_by_one.feed(line)
    expected = one_by_one.finish()
    assert [(c.id, c.name, json.loads(c.arguments)) for c in expected.tool_calls] == [("c1", "shell", {"a": 1})]
    assert work.parse_stream(raw) == expected
    with pytest.raises(ReplyError, match="before its final event"):
        work.parse_stream(newline.join(lines[:-1]))


def test_the_histograms_of_several_workers_are_summed() -> None:
    """A replica of several workers answers one scrape with each worker's series, labelled `worker`."""
    from harnessrl.runtime.proxy.metrics import ProxyMetrics, merged_exposition
    from prometheus_client import generate_latest

    workers = {"w0": ProxyMetrics(), "w1": ProxyMetrics()}
    for seconds in [0.003] * 60:
        workers["w0"].upstream_latency.observe(seconds)
    for seconds in [0.2] * 40:
        workers["w1"].upstream_latency.observe(seconds)
    merged = merged_exposition({name: generate_latest(m.registry).decode() for name, m in workers.items()})
    engine = summarize_waits(merged.decode())["engine call"]
    assert engine.count == 100 and engine.mean_ms == pytest.approx(81.8)
    assert (engine.p50_ms, engine.p90_ms) == (5.0, 250.0)


def test_profiles_of_a_replicas_workers_are_summed_by_function() -> None:
    """py-spy's `--subprocesses` roots each stack in its process; the summary adds the workers together."""
    raw = ('process 1:"harnessrl proxy";process 2:"harnessrl proxy --worker 0";main (runtime/proxy/main.py:10);'
           'parse (runtime/proxy/dialects/base.py:5) 30\n'
           'process 1:"harnessrl proxy";process 3:"harnessrl proxy --worker 1";main (runtime/proxy/main.py:10);'
           'parse (runtime/proxy/dialects/base.py:5) 10\n'
           'process 1:"harnessrl proxy";process 3:"harnessrl proxy --worker 1";main (runtime/proxy/main.py:10) 10\n')
    summary = summarize(raw)
    assert summary.startswith("50 CPU samples")
    assert "| `parse (harnessrl proxy/dialects/base.py)` | 80.0% |" in summary
    assert "| `main (harnessrl proxy/main.py)` | 100.0% |" in summary
    assert "process" not in summary


def test_run_options_that_need_another_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    from run import parse_args

    with pytest.raises(SystemExit) as exited:
        parse_args(["--profile-gil"])
    assert exited.value.code == 2 and "--profile-gil changes how --profile samples" in capsys.readouterr().err
    assert parse_args(["--profile", "--profile-gil"]).profile_gil
