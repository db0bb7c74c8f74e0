"""`harnessrl view`: the JSON API and the pages over a run directory written by the real writers
(tests/fixtures/viewer_run.py), a run still being appended to, and the command itself."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from harnessrl.runtime.contracts.coordinator import Completion, OutcomeKind, wilson_interval
from harnessrl.runtime.coordinator.journal import Journal, JournalEntry
from harnessrl.runtime.learner.metrics import MetricsSink
from harnessrl.runtime.viewer import charts
from harnessrl.runtime.viewer.app import create_app
from harnessrl.runtime.viewer.index import RunIndex, entry_head
from harnessrl.runtime.viewer.tokens import Colouring, colour, css

from tests.fixtures.viewer_run import BROKEN, EVAL_SOLVED, Run, step_metrics


@pytest.fixture()
def client(viewer_run: Run) -> TestClient:
    return TestClient(create_app(viewer_run.path))


def test_the_list_filters_by_harness_task_and_solved(client: TestClient) -> None:
    page = client.get("/api/rollouts", params={"harness": "oneshot", "solved": "true"}).json()
    assert {(r["harness"], r["solved"]) for r in page["rows"]} == {("oneshot", True)}
    # Two oneshot training groups, one solved rollout each, and the oneshot evaluation rollout.
    assert page["total"] == 3
    page = client.get("/api/rollouts", params={"task": "task-sort", "evaluation": "false"}).json()
    assert page["total"] == 4 and {r["task_id"] for r in page["rows"]} == {"task-sort"}
    # A form's "any" is an empty value: no filter.
    assert client.get("/api/rollouts", params={"solved": "", "harness": ""}).json()["total"] == 9


def test_the_list_sorts_and_pages(client: TestClient) -> None:
    first = client.get("/api/rollouts", params={"sort": "reward", "order": "desc", "per_page": 4}).json()
    assert first["total"] == 9 and first["pages"] == 3
    rewards = [r["reward"] for r in first["rows"]]
    assert rewards == sorted(rewards, reverse=True) and rewards[0] == 1.0
    last = client.get("/api/rollouts", params={"sort": "reward", "order": "desc", "per_page": 4, "page": 3}).json()
    assert [r["reward"] for r in last["rows"]] == [0.0]
    by_version = client.get("/api/rollouts", params={"sort": "version", "order": "desc"}).json()["rows"]
    # Versions 1 first, then 0; the evaluation rollout sampled nothing and comes last.
    assert [r["version"] for r in by_version] == [1] * 4 + [0] * 4 + [None]
    assert client.get("/api/rollouts", params={"sort": "secret"}).status_code == 422


def test_a_rollout_shows_its_calls_grader_output_and_the_journals_tokens(client: TestClient, viewer_run: Run) -> None:
    view = client.get("/api/rollouts/g0000001-r001").json()
    entry = viewer_run.entry("g0000001-r001")
    assert view["grader_output"] == "task-add: FAIL 1 of 3" and view["row"]["outcome"] == "wrong"
    assert view["row"]["reward"] == 0.0 and view["row"]["task_id"] == "task-add"
    # The group's rewards are 1 and 0: centred and divided by their std (scale_rewards: group, ε 1e-4).
    assert view["row"]["advantage"] == pytest.approx(-0.5 / (math.sqrt(0.5) + 1e-4))
    calls = view["calls"]
    assert [c["turn"] for c in calls] == [0, 1] and calls[1]["parent"] == 0
    assert calls[0]["sent"] == "Solve task-add with mini-swe-agent." and calls[0]["sampled"] == "def f(x): return x + 4"
    assert calls[1]["sent"] == " ok?" and calls[1]["sampled"] == " # done"
    [seq] = entry.sequences
    tokens = view["sequences"][0]["tokens"]
    assert [t["id"] for t in tokens] == seq.token_ids
    assert [t["logprob"] for t in tokens] == seq.logprobs
    assert [t["mask"] for t in tokens] == seq.loss_mask
    assert [t["version"] for t in tokens] == seq.policy_versions
    assert "".join(t["text"] for t in tokens) == "Solve task-add with mini-swe-agent.def f(x): return x + 4 ok? # done"
    sampled = next(t for t in tokens if t["mask"])
    assert sampled["colour"] == css(colour(Colouring.logprob, 1, sampled["logprob"], 0.0, 0))
    by_advantage = client.get("/api/rollouts/g0000001-r001", params={"colour": "advantage"}).json()
    assert by_advantage["sequences"][0]["tokens"][0]["colour"] == "rgb(238, 238, 238)"  # context: not trained
    assert client.get("/api/rollouts/g9999999-r000").status_code == 404


def test_token_colours_follow_their_values() -> None:
    assert colour(Colouring.logprob, 1, 0.0, 0.0, 0) == (255, 255, 255)  # p = 1
    assert colour(Colouring.logprob, 1, -50.0, 0.0, 0) == (230, 60, 60)  # p ~ 0
    assert colour(Colouring.advantage, 1, -1.0, 2.0, 0) == (40, 170, 70)
    assert colour(Colouring.advantage, 1, -1.0, -0.5, 0)[0] > colour(Colouring.advantage, 1, -1.0, -0.5, 0)[1]
    assert colour(Colouring.mask, 0, 0.0, 0.0, 0) != colour(Colouring.mask, 1, 0.0, 0.0, 0)
    assert colour(Colouring.version, 1, 0.0, 0.0, 0) != colour(Colouring.version, 1, 0.0, 0.0, 1)


def test_the_pages_render(client: TestClient) -> None:
    run = client.get("/")
    assert run.status_code == 200 and "<svg" in run.text and "mean reward" in run.text
    assert re.search(r"<td><a [^>]*>mini-swe-agent</a></td>\s*<td>4</td><td>4</td><td>2</td>", run.text)
    listing = client.get("/rollouts", params={"harness": "oneshot", "solved": "false"})
    assert listing.status_code == 200 and listing.text.count('class="unsolved"') == 2
    assert 'class="solved"' not in listing.text
    rollout = client.get("/rollouts/g0000000-r000", params={"colour": "version"})
    assert rollout.status_code == 200 and "task-add: PASS" in rollout.text
    assert re.search(r'<span class="tok" id="tok-0-0" style="background-color: rgb\(\d+, \d+, \d+\)" '
                     r'title="token \d+ · logprob 0.0000', rollout.text)
    assert client.get("/static/viewer.css").status_code == 200


def test_the_viewer_follows_a_run_that_goes_on(viewer_run: Run, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(viewer_run.path, run)
    client = TestClient(create_app(run))
    assert client.get("/api/rollouts").json()["total"] == 9 and len(client.get("/api/metrics").json()) == 2
    append_completion(run, 10, outcome=OutcomeKind.infra_error)
    MetricsSink(run / "checkpoints" / "metrics.jsonl").record(step_metrics(3))
    page = client.get("/api/rollouts", params={"sort": "seq", "order": "desc", "per_page": 1}).json()
    assert page["total"] == 10 and page["rows"][0]["outcome"] == "infra_error" and page["rows"][0]["reward"] is None
    assert [m["step"] for m in client.get("/api/metrics").json()] == [1, 2, 3]
    # The proxy's compaction renames a new file over its journal, without the sessions that ended: what the index
    # read from the file is read again (offsets into the old file would now land on other records).
    proxy = run / "journal" / "proxy-0.jsonl"
    gone = client.get("/api/rollouts/g0000000-r000").json()["row"]["session_id"]
    kept = proxy.with_suffix(".new")
    kept.write_bytes(b"".join(line for line in proxy.read_bytes().splitlines(keepends=True)
                              if json.loads(line)["sid"] != gone))
    kept.replace(proxy)
    assert client.get("/api/rollouts/g0000000-r000").json()["calls"] == []
    calls = client.get("/api/rollouts/g0000003-r001").json()["calls"]
    assert [c["sampled"] for c in calls] == ["def f(x): return x + 8", " # done"]


def test_the_command_prints_its_address_and_serves(viewer_run: Run) -> None:
    proc = subprocess.Popen([sys.executable, "-P", "-m", "harnessrl.cli", "view", str(viewer_run.path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+/)$", line.strip())
        assert found, line
        assert httpx.get(found[1] + "api/rollouts", timeout=10).json()["total"] == 9
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_list_row_is_read_from_the_record_before_its_sequences(viewer_run: Run) -> None:
    entry = viewer_run.entry("g0000002-r000")
    # Grader output that spells the sequences' key is escaped in JSON, so the cut is still at the field itself.
    tricky = entry.model_copy(update={"completion": entry.completion.model_copy(
        update={"grader_output": 'PASS ,"sequences": [] }'})})
    line = tricky.model_dump_json(exclude_computed_fields=True).encode()
    head = entry_head(line)
    assert head.seq == entry.seq and head.completion.rollout_id == "g0000002-r000"
    assert head.completion.session_id == entry.completion.session_id and head.completion.outcome == OutcomeKind.solved
    assert line.find(b',"sequences":') > line.find(b"PASS")


def saved_index(viewer_run: Run, tmp_path: Path) -> tuple[Path, RunIndex]:
    """A copy of the run without its viewer folder, and its index built and saved."""
    run = tmp_path / "run"
    shutil.copytree(viewer_run.path, run, ignore=shutil.ignore_patterns("viewer"))
    first = RunIndex(run)
    first.refresh()
    first.save()
    return run, first


def test_a_saved_index_is_taken_while_the_files_it_read_are_unchanged(viewer_run: Run, tmp_path: Path) -> None:
    run, first = saved_index(viewer_run, tmp_path)
    session = first.rows["g0000003-r000"].session_id
    again = RunIndex(run)  # before any refresh: all of it from the snapshot
    assert again.rows == first.rows and again.calls(session) == first.calls(session) and again.rows
    # The proxy's compaction replaced its journal: the snapshot no longer says where its records are.
    proxy = run / "journal" / "proxy-0.jsonl"
    shutil.copy(proxy, proxy.with_suffix(".new"))
    proxy.with_suffix(".new").replace(proxy)
    anew = RunIndex(run)
    assert anew.rows == {}
    anew.refresh()
    assert anew.rows == first.rows and anew.calls(session) == first.calls(session)


def test_a_saved_index_of_an_earlier_format_is_built_anew(viewer_run: Run, tmp_path: Path) -> None:
    run, _ = saved_index(viewer_run, tmp_path)
    # As the viewer before rows had prefix breaks saved it: no format, and rows without them.
    snap = json.loads((run / "viewer" / "index.json").read_text())
    snap.pop("format", None)
    for row in snap["rows"]:
        del row["prefix_breaks"], row["unknown_tool_calls"]
    (run / "viewer" / "index.json").write_text(json.dumps(snap))
    again = RunIndex(run)
    assert again.rows == {}
    again.refresh()
    assert again.rows[BROKEN].prefix_breaks == viewer_run.entry(BROKEN).completion.prefix_breaks
    assert again.rows[BROKEN].unknown_tool_calls == 1


def append_completion(run: Path, seq: int, **fields: Any) -> None:
    journal = Journal(run / "checkpoints" / "journal.jsonl", fsync=False)
    journal.append(JournalEntry(seq=seq, harness="oneshot", sequences=[], completion=Completion(
        rollout_id=f"g{seq:07d}-r000", lease_id="a", **{"outcome": OutcomeKind.wrong, **fields})))
    journal.close()


def test_a_page_reads_rows_a_refresh_on_another_thread_leaves_be(viewer_run: Run, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(viewer_run.path, run, ignore=shutil.ignore_patterns("viewer"))
    index = RunIndex(run)
    rows = index.refresh()
    reading = iter(rows)
    next(reading)
    append_completion(run, 20)
    assert len(index.refresh()) == 10
    assert len([next(reading), *reading]) == 8  # the page goes on over the rows it got


def test_what_a_rollout_wrote_is_shown_as_text_never_as_markup(viewer_run: Run, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(viewer_run.path, run, ignore=shutil.ignore_patterns("viewer"))
    # The grader's output and the error carry what the policy wrote: a page must not run it.
    append_completion(run, 21, grader_output='<script>alert("grader")</script>', error="<img src=x onerror=alert(1)>")
    page = TestClient(create_app(run)).get("/rollouts/g0000021-r000").text
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&#34;grader&#34;)&lt;/script&gt;" in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_one_task_under_two_harnesses_side_by_side(client: TestClient, viewer_run: Run) -> None:
    c = client.get("/api/compare", params={"task": "task-add"}).json()
    # Blank sides: the task's harnesses in order; each side shows its best rollout.
    assert (c["query"]["a"], c["query"]["b"]) == ("mini-swe-agent", "oneshot") and c["options"] == [
        "mini-swe-agent", "oneshot"]
    assert [r["rollout_id"] for r in c["a"]["rows"]] == ["g0000001-r000", "g0000001-r001"]
    # Evaluation rollouts of the task count on their side too.
    assert [r["rollout_id"] for r in c["b"]["rows"]] == ["g0000000-r000", "g0000000-r001", "eval-s0-p0-t0-a0"]
    assert (c["a"]["solved"], c["a"]["scored"], c["a"]["mean_reward"]) == (1, 2, 0.5)
    assert c["a"]["shown"]["rollout_id"] == "g0000001-r000" and c["b"]["shown"]["rollout_id"] == "g0000000-r000"
    assert [x["sampled"] for x in c["calls_b"]] == ["def f(x): return x + 1", " # done"]
    # A side's rollout picked by hand; and the same task at two policy versions.
    picked = client.get("/api/compare", params={"task": "task-add", "ra": "g0000001-r001"}).json()
    assert picked["a"]["shown"]["rollout_id"] == "g0000001-r001" and picked["calls_a"][0]["sampled"] == \
        "def f(x): return x + 4"
    by_version = client.get("/api/compare", params={"task": "task-sort", "by": "version"}).json()
    assert by_version["options"] == ["0", "1"]
    assert {r["version"] for r in by_version["a"]["rows"]} == {0} and {r["version"] for r in by_version["b"]["rows"]} == {1}
    assert {r["harness"] for r in by_version["a"]["rows"]} == {"mini-swe-agent"}
    page = client.get("/compare", params={"task": "task-add", "a": "oneshot", "b": "mini-swe-agent"})
    assert page.status_code == 200
    assert page.text.index('id="side-a"') < page.text.index("<h2>harness oneshot</h2>") < page.text.index(
        'id="side-b"') < page.text.index("<h2>harness mini-swe-agent</h2>")
    # Reachable from a rollout and from the list.
    rollout = client.get("/rollouts/g0000001-r001").text
    assert 'href="http://testserver/compare?task=task-add&amp;by=harness&amp;a=mini-swe-agent&amp;ra=g0000001-r001"' in rollout
    assert 'href="http://testserver/compare?task=task-add&amp;by=version&amp;a=1&amp;ra=g0000001-r001"' in rollout
    assert client.get("/rollouts", params={"task": "task-add"}).text.count('class="compare"') == 5  # 4 + its eval


def test_the_call_graph_shows_each_sequence_and_each_break_with_the_proxys_cause(client: TestClient,
                                                                                 viewer_run: Run) -> None:
    view = client.get(f"/api/rollouts/{BROKEN}").json()
    graph, entry = view["graph"], viewer_run.entry(BROKEN)
    # The causes the viewer replays are those the proxy read live, and add up to what the runner reported.
    assert [t["cause"] for t in graph["turns"]] == [c and c.value for c in viewer_run.causes[BROKEN]] == [
        None, None, "history_changed", "retry"]
    assert graph["breaks"] == {k.value: n for k, n in entry.completion.prefix_breaks.items()} == {
        "history_changed": 1, "retry": 1}
    [first, second] = graph["roots"]
    assert (first["turns"], first["cause"], second["turns"], second["cause"]) == ([0, 1], None, [2], "history_changed")
    [retry] = first["branches"]
    assert (retry["turns"], retry["after"], retry["cause"]) == ([3], 0, "retry")
    # Each branch is the journaled training sequence that ends at its last turn.
    for branch in (first, second, retry):
        assert entry.sequences[branch["sequence"]].node_ids[-1] == branch["turns"][-1]
    assert len(entry.sequences) == 3
    page = client.get(f"/rollouts/{BROKEN}").text
    assert re.search(r'data-cause="history_changed">\s*<span class="branch-head">sequence \d · <span class="cause '
                     r'cause-history_changed">history_changed</span> \(a new root\)', page)
    assert 'href="#calls-3"' in page and 'id="calls-3"' in page
    plain = client.get("/api/rollouts/g0000001-r001").json()["graph"]
    assert plain["breaks"] == {} and [b["turns"] for b in plain["roots"]] == [[0, 1]]


def test_the_run_page_has_pass_at_1_with_intervals_the_matrix_breaks_and_mismatches(client: TestClient) -> None:
    assert [r["step"] for r in client.get("/api/evals").json()] == [0, 2]
    page = client.get("/").text
    lo, hi = wilson_interval(3, 4)
    cell = f"0.750 (3/4) <span class=\"interval\">[{lo:.2f}, {hi:.2f}]</span>"
    row = re.search(r'<tr data-pool="oneshot-pool">(.*?)</tr>', page, re.S)
    assert row and row[1].count("<td>") == 3 and cell in row[1] and "0.250 (1/4)" in row[1]
    assert re.search(r"<th>step 0</th><th>step 2</th>", page)
    # Each plotted pass@1 has its exact value, counts and interval as its hover text.
    for step, solved in EVAL_SOLVED.items():
        for harness, n in solved.items():
            low, high = wilson_interval(n, 4)
            assert (f"<title>{harness} ({harness}-pool) · step {step} · pass@1 {n / 4:.3f} ({n}/4) · 95% "
                    f"[{low:.3f}, {high:.3f}]</title>") in page
    # The broken rollout's two breaks and its call to a tool it was not offered, under its harness.
    mini = re.search(r'mini-swe-agent</a></td>.*?<td class="breaks">(.*?)</td>\s*<td class="mismatches">(.*?)</td>',
                     page, re.S)
    assert mini and (mini[1], mini[2]) == ("history_changed 1, retry 1", "1 / 0")
    oneshot = re.search(r'oneshot</a></td>.*?<td class="breaks">(.*?)</td>', page, re.S)
    assert oneshot and oneshot[1] == "0"


def test_a_plots_hover_text_is_escaped_text() -> None:
    m = step_metrics(1).model_copy(update={"mean_reward_by_harness": {"<script>alert(1)</script>": 0.5},
                                           "solved_rate_by_harness": {}})
    svg = charts.svg([m])
    assert "<script>" not in svg and "<title>&lt;script&gt;alert(1)&lt;/script&gt; · step 1 · mean reward 0.500" in svg
