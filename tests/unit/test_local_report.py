"""`harnessrl report`: plots and a summary from a run directory's metrics and completion journal."""

from __future__ import annotations

from pathlib import Path

import pytest
from harnessrl.runtime.contracts.coordinator import (
    Completion,
    CoordinatorStatus,
    EvalProgress,
    EvalRecord,
    OutcomeKind,
    PoolRollouts,
    PoolScore,
    eval_regressions,
)
from harnessrl.runtime.coordinator.journal import JournalEntry
from harnessrl.runtime.learner.metrics import StepMetrics
from harnessrl.runtime.trajectory.models import BreakCause

from harnessrl.local.report import (
    RunSummary,
    main,
    moving_average,
    read_completions,
    summarize,
    tool_calls_by_harness,
)


def metrics(step: int, reward: float) -> StepMetrics:
    return StepMetrics(
        step=step, policy_version=step, time=float(step), rollouts_scored=16 * step, rollouts_unscored=1,
        rollouts_stale=0, groups_trained=2, groups_zero_variance=0, mean_reward=reward,
        mean_reward_by_harness={"oneshot": reward}, solved_rate_by_harness={"oneshot": reward, "mini-swe-agent": 0.0},
        loss=0.1, clip_fraction=0.0, kl=0.0, tokens=100, loss_tokens=20, tokens_per_s=50.0, step_s=1.0, sync_s=0.1,
        grad_norm=1.0, sequences_per_rollout_by_harness={"oneshot": 1.0 + step % 2},
        loss_tokens_by_harness={"oneshot": 10 * step}, tokens_by_harness={"oneshot": 100},
        repeated_prefix_tokens_by_harness={"oneshot": 40 if step % 2 else 20},
    )


def entry(seq: int, harness: str, outcome: OutcomeKind, tool_calls: int, unknown: int = 0,
          breaks: dict[BreakCause, int] | None = None) -> JournalEntry:
    completion = Completion(rollout_id=f"g{seq}-r000", lease_id=f"g{seq}-r000.a1", outcome=outcome, tool_calls=tool_calls,
                            correctness=1.0 if outcome == OutcomeKind.solved else 0.0, unknown_tool_calls=unknown,
                            prefix_breaks=breaks or {})
    return JournalEntry(seq=seq, harness=harness, completion=completion, sequences=[])


def write_run(run_dir: Path, rewards: list[float], entries: list[JournalEntry]) -> None:
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "metrics.jsonl").write_text(
        "".join(metrics(i + 1, r).model_dump_json() + "\n" for i, r in enumerate(rewards))
    )
    (checkpoints / "journal.jsonl").write_text("".join(e.model_dump_json() + "\n" for e in entries))


def test_moving_average_is_over_the_last_window() -> None:
    assert moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]


def test_summary_compares_first_and_last_quarter_and_counts_tool_calls_of_solved_rollouts() -> None:
    rewards = [0.1] * 5 + [0.3] * 10 + [0.5] * 5
    entries = [entry(1, "oneshot", OutcomeKind.solved, 0), entry(2, "mini", OutcomeKind.solved, 4),
               entry(3, "mini", OutcomeKind.solved, 2), entry(4, "mini", OutcomeKind.wrong, 9)]
    summary = summarize([metrics(i + 1, r) for i, r in enumerate(rewards)], tool_calls_by_harness(entries), [])
    assert summary.steps == 20
    assert summary.first_reward == 0.1 and summary.last_reward == 0.5
    assert summary.solved_first == {"mini-swe-agent": 0.0, "oneshot": 0.1} and summary.solved_last["oneshot"] == 0.5
    assert summary.tool_calls_solved == {"mini": 3.0, "oneshot": 0.0}
    assert summary.pass_at_1 == {"oneshot": 0.5, "mini-swe-agent": 0.0}
    # Half the steps split each rollout into two sequences; tokens trained add up over the steps.
    assert summary.sequences_per_rollout == {"oneshot": 1.5}
    assert summary.trained_tokens == {"oneshot": 10 * sum(range(1, 21))}
    # 40 and 20 of each step's 100 tokens in turn repeated a prefix.
    assert summary.repeated_prefix_share == {"oneshot": pytest.approx(0.3)}


def test_report_writes_pngs_and_markdown(tmp_path: Path, capsys: object) -> None:
    write_run(tmp_path, [0.1, 0.2, 0.4, 0.5], [entry(1, "oneshot", OutcomeKind.solved, 1)])
    assert main([str(tmp_path)]) == 0
    report = tmp_path / "report" / "report.md"
    text = report.read_text()
    assert "mean reward, first quarter of the steps: 0.100" in text
    assert "mean reward, last quarter of the steps: 0.500" in text
    assert "training solved rate, first → last quarter: mini-swe-agent 0.000 → 0.000, oneshot 0.100 → 0.500" in text
    assert "| oneshot | 0.50 | 1.000 | 1.500 | 100 | 30% |" in text
    for png in ("reward.png", "pass_at_1.png", "tool_calls.png"):
        data = (tmp_path / "report" / png).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 1000


def test_report_reads_the_journal_of_a_run_killed_while_writing_it(tmp_path: Path) -> None:
    entries = [entry(1, "oneshot", OutcomeKind.solved, 1), entry(2, "oneshot", OutcomeKind.wrong, 3)]
    write_run(tmp_path, [0.1, 0.2], entries)
    journal = tmp_path / "checkpoints" / "journal.jsonl"
    torn = journal.read_bytes() + entry(3, "oneshot", OutcomeKind.solved, 2).model_dump_json().encode()[:40]
    journal.write_bytes(torn)
    assert read_completions(tmp_path) == entries
    assert journal.read_bytes() == torn  # a report only reads
    assert main([str(tmp_path)]) == 0


def test_report_without_metrics_says_so(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([str(tmp_path)]) == 2
    assert "no metrics" in capsys.readouterr().err


def test_live_view_shows_each_step_once_across_a_rewrite_and_a_torn_line(tmp_path: Path) -> None:
    from harnessrl.local.live import LiveView

    path = tmp_path / "metrics.jsonl"
    view = LiveView(path, tmp_path / "eval.jsonl", "http://127.0.0.1:9", live=False)
    assert view.new_steps() == []
    path.write_text(metrics(1, 0.1).model_dump_json() + "\n" + metrics(2, 0.2).model_dump_json()[:20])
    assert [m.step for m in view.new_steps()] == [1]
    # A resumed learner truncates the file to its checkpoint and appends again.
    path.write_text(metrics(1, 0.1).model_dump_json() + "\n" + metrics(2, 0.3).model_dump_json() + "\n")
    assert [m.step for m in view.new_steps()] == [2]
    assert view.new_steps() == []


def eval_record(step: int, solved: dict[str, int]) -> EvalRecord:
    pools = [PoolScore(pool=p, harness=p, rollouts=4, scored=4, solved=n, unscored=0, pending=0, pass_at_1=n / 4,
                       mean_correctness=n / 4) for p, n in solved.items()]
    return EvalRecord(step=step, policy_version=step, model=f"m-v{step}", time=0.0, tasks=4, attempts=1, pools=pools)


def test_report_takes_pass_at_1_from_the_evaluation_rounds(tmp_path: Path) -> None:
    eval_entry = entry(9, "oneshot", OutcomeKind.solved, 7)
    eval_entry.completion.rollout_id = "eval-s2-abc123/oneshot/t/a0"
    breaks = {BreakCause.retry: 1, BreakCause.reply_changed: 2}
    write_run(tmp_path, [0.1, 0.2, 0.4, 0.5], [entry(1, "oneshot", OutcomeKind.solved, 1, unknown=1, breaks=breaks),
                                               eval_entry, entry(10, "oneshot", OutcomeKind.wrong, 0, breaks=breaks)])
    (tmp_path / "checkpoints" / "eval.jsonl").write_text(
        eval_record(0, {"oneshot": 0, "mini-swe-agent": 1}).model_dump_json() + "\n"
        + eval_record(2, {"oneshot": 1, "mini-swe-agent": 0}).model_dump_json() + "\n"
        + eval_record(4, {"oneshot": 3, "mini-swe-agent": 2}).model_dump_json() + "\n")
    assert main([str(tmp_path)]) == 0
    summary = RunSummary.model_validate_json((tmp_path / "report" / "summary.json").read_text())
    # The latest round's held-out pass@1, not the training rollouts' solved rate.
    assert summary.pass_at_1 == {"oneshot": 0.75, "mini-swe-agent": 0.5} and summary.pass_at_1_step == 4
    assert summary.tool_calls_solved == {"oneshot": 1.0}  # eval rollouts are not counted as training ones
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| harness | pass@1 (evaluation at step 4) |" in text and "| oneshot | 0.75 | 1.000 | 1.500 | 100 |" in text
    assert "![pass@1 matrix](pass_at_1_matrix.png)" in text
    # The base policy's round (step 0) beside the latest: what training changed.
    assert "held-out pass@1, base policy (step 0) → step 4: oneshot 0.000 → 0.750, mini-swe-agent 0.250 → 0.500" in text
    assert "could not run (unknown tool / arguments its schema refused): oneshot 1 / 0" in text
    assert "one more training sequence (prefix breaks, by cause): oneshot reply_changed 4, retry 2" in text
    assert "below its best): none" in text  # 3/4 after 1/4 and 0/4; 2/4 after 0/4 and 1/4
    assert (tmp_path / "report" / "pass_at_1_matrix.png").read_bytes().startswith(b"\x89PNG")
    # Without eval.jsonl the report falls back to the training solved rate, and says so.
    (tmp_path / "checkpoints" / "eval.jsonl").unlink()
    assert main([str(tmp_path)]) == 0
    assert "| harness | solved rate (last step, training rollouts) |" in (tmp_path / "report" / "report.md").read_text()


def test_collapse_alarm_fires_only_beyond_the_latest_rounds_interval() -> None:
    # 2/4 after a best of 3/4 is noise (the 95% interval of 2/4 reaches 0.85); 0/4 after 4/4 is not (it tops at 0.49).
    noise = [eval_record(0, {"a": 1}), eval_record(2, {"a": 3}), eval_record(4, {"a": 2})]
    assert eval_regressions(noise) == []
    fallen = [eval_record(0, {"a": 1, "b": 0}), eval_record(2, {"a": 4, "b": 4}), eval_record(4, {"a": 4, "b": 4}),
              eval_record(6, {"a": 0, "b": 4})]
    [alarm] = eval_regressions(list(reversed(fallen)))  # rounds are taken by step, not by order in the file
    assert (alarm.pool, alarm.best_step, alarm.best_pass_at_1, alarm.step, alarm.pass_at_1) == ("a", 2, 1.0, 6, 0.0)
    assert alarm.describe() == "a held-out pass@1 fell from 1.00 (step 2) to 0.00 (step 6)"
    assert eval_regressions(fallen[:1]) == [] and eval_regressions([]) == []


def test_report_names_a_collapse(tmp_path: Path) -> None:
    write_run(tmp_path, [0.1, 0.9, 0.2], [entry(1, "oneshot", OutcomeKind.solved, 1)])
    (tmp_path / "checkpoints" / "eval.jsonl").write_text("".join(
        eval_record(step, {"oneshot": n}).model_dump_json() + "\n" for step, n in ((0, 1), (2, 4), (4, 0))))
    assert main([str(tmp_path)]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "below its best): oneshot held-out pass@1 fell from 1.00 (step 2) to 0.00 (step 4)" in text


def test_report_names_the_best_checkpoint_on_disk(tmp_path: Path) -> None:
    write_run(tmp_path, [0.1, 0.5, 0.9, 0.2, 0.3, 0.1], [entry(1, "oneshot", OutcomeKind.solved, 1)])
    checkpoints = tmp_path / "checkpoints"
    # Step 2's checkpoint was pruned, step 3 was evaluated without one and step 6 fell back: step 4 is the best.
    for step in (4, 6):
        (checkpoints / f"step-{step:07d}").mkdir()
    (checkpoints / "eval.jsonl").write_text("".join(
        eval_record(step, {"oneshot": n, "mini-swe-agent": m}).model_dump_json() + "\n"
        for step, n, m in ((0, 1, 0), (2, 4, 4), (3, 4, 3), (4, 3, 2), (6, 1, 1))))
    assert main([str(tmp_path)]) == 0
    summary = RunSummary.model_validate_json((tmp_path / "report" / "summary.json").read_text())
    assert (summary.best_step, summary.best_pass_at_1) == (4, 0.625)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "- best checkpoint: step 4 (held-out pass@1 0.625, the mean over the eval pools)" in text
    # With a validation split, it picks the checkpoint; the report gives the chosen one's held-out pass@1.
    validated = {0: (0, 0), 4: (1, 1), 6: (4, 4)}
    (checkpoints / "eval.jsonl").write_text("".join(
        eval_record(step, {"oneshot": n, "mini-swe-agent": m}).model_copy(update={"validation": eval_record(
            step, {"oneshot": validated[step][0], "mini-swe-agent": validated[step][1]}).pools}).model_dump_json() + "\n"
        for step, n, m in ((0, 1, 0), (4, 3, 2), (6, 1, 1))))
    assert main([str(tmp_path)]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert ("- best checkpoint: step 6 (held-out pass@1 0.250, the mean over the eval pools; picked by validation "
            "pass@1 1.000)") in text
    (checkpoints / "eval.jsonl").unlink()
    assert main([str(tmp_path)]) == 0
    assert "- best checkpoint: - (no evaluated checkpoint on disk)" in (tmp_path / "report" / "report.md").read_text()


def test_live_view_prints_each_evaluation_round_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harnessrl.local.live import LiveView, status_line

    metrics_path = tmp_path / "metrics.jsonl"
    metrics_path.write_text(metrics(1, 0.1).model_dump_json() + "\n" + metrics(2, 0.2).model_dump_json() + "\n")
    (tmp_path / "eval.jsonl").write_text(eval_record(2, {"oneshot": 3, "mini-swe-agent": 1}).model_dump_json() + "\n")
    view = LiveView(metrics_path, tmp_path / "eval.jsonl", "http://127.0.0.1:9", live=False)
    view.refresh()
    view.refresh()
    out = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in out] == ["step 1", "step 2", "eval"]
    assert out[1].startswith("step 2  policy v2  reward 0.200  solved (train) [mini-swe-agent=0.00 oneshot=0.20]")
    assert out[2] == "eval  step 2  policy v2  pass@1 [oneshot=0.75 (3/4) mini-swe-agent=0.25 (1/4)]  4 tasks × 1"
    status = CoordinatorStatus(step=2, policy_version=2, open_groups=1, ready_groups=0, leased=3, rollouts_scored=9,
                               rollouts_unscored=0, rollouts_stale=0, groups_skipped_zero_variance=0,
                               policy_model="m-v2", done=False,
                               evaluating=EvalProgress(step=2, policy_version=2, rollouts=8, finished=5))
    assert status_line(status).endswith("scored 9  evaluating step 2 5/8")
    busy = status.model_copy(update={"pools": {"oneshot": PoolRollouts(active=2), "mini-swe-agent": PoolRollouts(active=1)}})
    assert "in flight 3 [mini-swe-agent=1 oneshot=2]" in status_line(busy)


def test_live_view_without_terminal_prints_a_waiting_line_when_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log (no terminal to redraw on) gets a waiting line with the rollouts in flight per pool once it has
    been quiet for QUIET_S, and none while steps keep coming."""
    from harnessrl.local import live

    status = CoordinatorStatus(step=0, policy_version=0, open_groups=2, ready_groups=0, leased=3, rollouts_scored=0,
                               rollouts_unscored=0, rollouts_stale=0, groups_skipped_zero_variance=0,
                               policy_model="m", done=False,
                               pools={"oneshot": PoolRollouts(active=2), "mini-swe-agent": PoolRollouts(active=1)})
    view = live.LiveView(tmp_path / "metrics.jsonl", tmp_path / "eval.jsonl", "http://127.0.0.1:9", live=False)
    monkeypatch.setattr(view, "coordinator", lambda: status)
    view.refresh()
    assert capsys.readouterr().out == ""  # not quiet long enough yet
    monkeypatch.setattr(live, "QUIET_S", 0.0)
    view.refresh()
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("  … waiting: step 0  policy m  in flight 3 [mini-swe-agent=1 oneshot=2]")


def test_report_says_what_the_run_used(tmp_path: Path) -> None:
    from harnessrl.runtime.contracts.coordinator import Timings
    from harnessrl.runtime.trajectory.models import TrainingSequence

    timed = [entry(1, "oneshot", OutcomeKind.solved, 1), entry(2, "oneshot", OutcomeKind.wrong, 2)]
    for e, seconds in zip(timed, (30.0, 45.0), strict=True):
        e.completion.timings = Timings(started_at=1000.0, finished_at=1000.0 + seconds)
    timed[0].sequences = [TrainingSequence(session_id="s", node_ids=[0], token_ids=[1, 2, 3, 4], loss_mask=[0, 1, 1, 1],
                                           logprobs=[0.0, -0.1, -0.1, -0.1], policy_versions=[0, 0, 0, 0])]
    write_run(tmp_path, [0.1, 0.2, 0.4], [*timed, entry(3, "oneshot", OutcomeKind.infra_error, 0)])
    (tmp_path / "plan.json").write_text('{"learner": {"gpus": 2}, "engine": {"gpus": 1, "replicas": 2}}')
    assert main([str(tmp_path)]) == 0
    usage = RunSummary.model_validate_json((tmp_path / "report" / "summary.json").read_text()).usage
    # Steps at t = 1, 2, 3 s, the first taking 1 s: a 3 s span; 2 learner GPUs, 2 engines of 1 GPU.
    assert usage.gpu_seconds == {"learner": 6.0, "engine": 6.0}
    assert (usage.rollouts, usage.sandbox_seconds, usage.tokens_sampled, usage.tokens_trained) == (3, 75.0, 3, 300)
    text = (tmp_path / "report" / "report.md").read_text()
    assert ("- usage: GPU-seconds engine 6, learner 6; 3 rollouts finished, 75 sandbox-seconds; 3 tokens sampled "
            "(scored rollouts), 300 tokens trained") in text
