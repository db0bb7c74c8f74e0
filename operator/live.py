"""Progress of a local run as a user expects it: step, policy version, reward and pass@1 per harness,
rollouts in flight, tokens/s. Reads the learner's metrics JSON lines and its coordinator's status."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
from harnessrl.runtime.learner.metrics import StepMetrics
from harnessrl.runtime.learner.protocol import CoordinatorStatus
from pydantic import ValidationError


def step_line(m: StepMetrics) -> str:
    """One line per optimiser step."""
    reward = "-" if m.mean_reward is None else f"{m.mean_reward:.3f}"
    per_harness = " ".join(f"{h}={r:.2f}" for h, r in sorted(m.solved_rate_by_harness.items()))
    return (
        f"step {m.step}  policy v{m.policy_version}  reward {reward}  pass@1 [{per_harness or '-'}]  "
        f"rollouts {m.rollouts_scored} scored/{m.rollouts_unscored} unscored/{m.rollouts_stale} stale  "
        f"loss {m.loss:+.4f}  {m.tokens_per_s:.0f} tok/s"
    )


def status_line(s: CoordinatorStatus) -> str:
    return (
        f"step {s.step}  policy {s.policy_model}  in flight {s.leased}  open groups {s.open_groups}  "
        f"ready {s.ready_groups}  scored {s.rollouts_scored}"
    )


class LiveView:
    """Prints each new step once; between steps, a live status line redrawn in place on a terminal."""

    def __init__(self, metrics_path: Path, coordinator_url: str, live: bool) -> None:
        self.metrics_path = metrics_path
        self.coordinator_url = coordinator_url
        self.live = live
        self.last_step = 0

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

    def coordinator(self) -> CoordinatorStatus | None:
        try:
            response = httpx.get(f"{self.coordinator_url}/v1/status", timeout=2.0)
            return CoordinatorStatus.model_validate_json(response.content) if response.status_code == 200 else None
        except (httpx.HTTPError, ValidationError):
            return None

    def refresh(self, final: bool = False) -> None:
        clear = "\r\033[K" if self.live else ""
        for m in self.new_steps():
            print(f"{clear}{step_line(m)}", flush=True)
        if self.live and not final:
            status = self.coordinator()
            if status is not None:
                sys.stdout.write(f"{clear}  … {status_line(status)}")
                sys.stdout.flush()
