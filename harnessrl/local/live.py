"""Progress of a local run as a user expects it: step, policy version, reward and pass@1 per harness,
rollouts in flight, tokens/s. Reads the learner's metrics and evaluation JSON lines and its coordinator's status.

pass@1 per harness comes from the run's evaluation rounds (spec.eval: held-out tasks, one line per round); each
step's line shows the training rollouts' solved rate, labelled as such."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pydantic import ValidationError

from harnessrl.runtime.contracts.coordinator import CoordinatorStatus, EvalRecord
from harnessrl.runtime.contracts.status import fetch as fetch_status
from harnessrl.runtime.learner.evaluation import read_records
from harnessrl.runtime.learner.metrics import StepMetrics

# Seconds without a printed line after which a non-terminal run prints a waiting line.
QUIET_S = 20.0


def step_line(m: StepMetrics) -> str:
    """One line per optimiser step."""
    reward = "-" if m.mean_reward is None else f"{m.mean_reward:.3f}"
    per_harness = " ".join(f"{h}={r:.2f}" for h, r in sorted(m.solved_rate_by_harness.items()))
    return (
        f"step {m.step}  policy v{m.policy_version}  reward {reward}  solved (train) [{per_harness or '-'}]  "
        f"rollouts {m.rollouts_scored} scored/{m.rollouts_unscored} unscored/{m.rollouts_stale} stale  "
        f"loss {m.loss:+.4f}  {m.tokens_per_s:.0f} tok/s"
    )


def eval_line(r: EvalRecord) -> str:
    """One line per evaluation round: pass@1 (solved/scored) per pool."""
    pools = " ".join(
        f"{p.pool}={'n/a' if p.pass_at_1 is None else f'{p.pass_at_1:.2f}'} ({p.solved}/{p.scored})" for p in r.pools
    )
    return f"eval  step {r.step}  policy v{r.policy_version}  pass@1 [{pools}]  {r.tasks} tasks × {r.attempts}"


def status_line(s: CoordinatorStatus) -> str:
    evaluating = f"  evaluating step {e.step} {e.finished}/{e.rollouts}" if (e := s.evaluating) is not None else ""
    pools = " ".join(f"{p}={r.active}" for p, r in sorted(s.pools.items()))
    return (
        f"step {s.step}  policy {s.policy_model}  in flight {s.leased}{f' [{pools}]' if pools else ''}  "
        f"open groups {s.open_groups}  "
        f"ready {s.ready_groups}  scored {s.rollouts_scored}{evaluating}"
    )


class LiveView:
    """Prints each new step once; between steps, a live status line redrawn in place on a terminal."""

    def __init__(self, metrics_path: Path, eval_path: Path, coordinator_url: str, live: bool) -> None:
        self.metrics_path = metrics_path
        self.eval_path = eval_path
        self.coordinator_url = coordinator_url
        self.live = live
        self.last_step = 0
        self.last_eval = 0
        self.last_print = time.monotonic()

    def new_steps(self) -> list[StepMetrics]:
        """Steps not shown yet. The whole (small) file is read each time: a resumed learner rewrites it."""
        if not self.metrics_path.exists():
            return []
        steps = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                m = StepMetrics.model_validate_json(line)
            except ValidationError:
                continue  # the learner is mid-write
            if m.step > self.last_step:
                steps.append(m)
                self.last_step = m.step
        return steps

    def new_evals(self) -> list[EvalRecord]:
        """Evaluation rounds not shown yet (the file is rewritten whole by the learner, so no torn lines)."""
        try:
            records = read_records(self.eval_path)
        except (OSError, ValidationError):
            return []
        fresh = [r for r in records if r.step > self.last_eval]
        if fresh:
            self.last_eval = fresh[-1].step
        return fresh

    def coordinator(self) -> CoordinatorStatus | None:
        return fetch_status(self.coordinator_url)

    def refresh(self, final: bool = False) -> None:
        clear = "\r\033[K" if self.live else ""
        for m in self.new_steps():
            print(f"{clear}{step_line(m)}", flush=True)
            self.last_print = time.monotonic()
        for r in self.new_evals():
            print(f"{clear}{eval_line(r)}", flush=True)
            self.last_print = time.monotonic()
        if final:
            return
        # Without a terminal to redraw on, a waiting line now and then, so a log never goes silent for long.
        if self.live or time.monotonic() - self.last_print >= QUIET_S:
            status = self.coordinator()
            if status is not None:
                if self.live:
                    sys.stdout.write(f"{clear}  … {status_line(status)}")
                    sys.stdout.flush()
                else:
                    print(f"  … waiting: {status_line(status)}", flush=True)
                    self.last_print = time.monotonic()
