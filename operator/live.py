"""Progress of a local run as a user expects it: step, policy version, reward and pass@1 per harness,
rollouts in flight, tokens/s. Reads the learner's metrics JSON lines and its coordinator's status."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
from harnessrl.runtime.learner.metrics import StepMetrics
from harnessrl.runtime.learner.protocol import CoordinatorStatus
from pydantic import ValidationError


def step_line(m: StepMetrics, total_steps: int | None = None) -> str:
    """One line per optimiser step."""
    reward = "-" if m.mean_reward is None else f"{m.mean_reward:.3f}"
    per_harness = " ".join(f"{h}={r:.2f}" for h, r in sorted(m.solved_rate_by_harness.items()))
    of = f"/{total_steps}" if total_steps else ""
    return (
        f"step {m.step}{of}  policy v{m.policy_version}  reward {reward}  pass@1 [{per_harness or '-'}]  "
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
        self.offset = 0

    def new_steps(self) -> list[StepMetrics]:
        if not self.metrics_path.exists():
            return []
        with self.metrics_path.open() as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        # Only whole lines: the learner may be mid-write.
        complete = chunk[: chunk.rfind("\n") + 1]
        self.offset += len(complete.encode())
        return [StepMetrics.model_validate_json(line) for line in complete.splitlines() if line.strip()]

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
