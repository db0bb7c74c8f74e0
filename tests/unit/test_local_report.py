"""`harnessrl report`: plots and a summary from a run directory's metrics and completion journal."""

from __future__ import annotations

from pathlib import Path

from harnessrl.operator.report import main, moving_average, summarize, tool_calls_by_harness
from harnessrl.runtime.learner.journal import JournalEntry
from harnessrl.runtime.learner.metrics import StepMetrics
from harnessrl.runtime.learner.protocol import Completion, OutcomeKind


def metrics(step: int, reward: float) -> StepMetrics:
    return StepMetrics(
        step=step, policy_version=step, time=float(step), rollouts_scored=16 * step, rollouts_unscored=1,
        rollouts_stale=0, groups_trained=2, groups_zero_variance=0, mean_reward=reward,
        mean_reward_by_harness={"oneshot": reward}, solved_rate_by_harness={"oneshot": reward, "mini-swe-agent": 0.0},
        loss=0.1, clip_fraction=0.0, kl=0.0, tokens=100, loss_tokens=20, tokens_per_s=50.0, step_s=1.0, sync_s=0.1,
        grad_norm=1.0,
    )


def entry(seq: int, harness: str, outcome: OutcomeKind, tool_calls: int) -> JournalEntry:
    completion = Completion(rollout_id=f"g{seq}-r000", lease_id=f"g{seq}-r000.a1", outcome=outcome, tool_calls=tool_calls,
                            correctness=1.0 if outcome == OutcomeKind.solved else 0.0)
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


def test_summary_compares_first_and_last_tenth_and_counts_tool_calls_of_solved_rollouts() -> None:
    rewards = [0.1] * 10 + [0.5] * 10
    entries = [entry(1, "oneshot", OutcomeKind.solved, 0), entry(2, "mini", OutcomeKind.solved, 4),
               entry(3, "mini", OutcomeKind.solved, 2), entry(4, "mini", OutcomeKind.wrong, 9)]
    summary = summarize([metrics(i + 1, r) for i, r in enumerate(rewards)], tool_calls_by_harness(entries))
    assert summary.steps == 20
    assert summary.first_reward == 0.1 and summary.last_reward == 0.5
    assert summary.tool_calls_solved == {"mini": 3.0, "oneshot": 0.0}
    assert summary.pass_at_1 == {"oneshot": 0.5, "mini-swe-agent": 0.0}


def test_report_writes_pngs_and_markdown(tmp_path: Path, capsys: object) -> None:
    write_run(tmp_path, [0.1, 0.2, 0.4, 0.5], [entry(1, "oneshot", OutcomeKind.solved, 1)])
    assert main([str(tmp_path)]) == 0
    report = tmp_path / "report" / "report.md"
    text = report.read_text()
    assert "mean reward, first tenth of the steps: 0.100" in text
    assert "mean reward, last tenth of the steps: 0.500" in text
    for png in ("reward.png", "pass_at_1.png", "tool_calls.png"):
        data = (tmp_path / "report" / png).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 1000


def test_report_without_metrics_says_so(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([str(tmp_path)]) == 2
    assert "no metrics" in capsys.readouterr().err


def test_live_view_shows_each_step_once_across_a_rewrite_and_a_torn_line(tmp_path: Path) -> None:
    from harnessrl.operator.live import LiveView

    path = tmp_path / "metrics.jsonl"
    view = LiveView(path, "http://127.0.0.1:9", live=False)
    assert view.new_steps() == []
    path.write_text(metrics(1, 0.1).model_dump_json() + "\n" + metrics(2, 0.2).model_dump_json()[:20])
    assert [m.step for m in view.new_steps()] == [1]
    # A resumed learner truncates the file to its checkpoint and appends again.
    path.write_text(metrics(1, 0.1).model_dump_json() + "\n" + metrics(2, 0.3).model_dump_json() + "\n")
    assert [m.step for m in view.new_steps()] == [2]
    assert view.new_steps() == []
