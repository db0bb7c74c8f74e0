"""Rollout samples for the trackers: of each step's trained rollouts, per harness, the best, the worst and one
at random, each with a link to it in `harnessrl view` (runtime/viewer), so a curve's point leads to what the
policy did. Pure: tracking.py hands the table to each tracker.

The random one is drawn by the step number, so a learner that resumes and takes a step again logs the same.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Literal

from harnessrl.runtime.learner.coordinator import TrainGroup, TrainRollout
from pydantic import BaseModel


class RolloutSample(BaseModel):
    step: int
    harness: str
    pick: Literal["best", "worst", "random"]
    rollout_id: str
    task_id: str
    reward: float
    advantage: float
    sequences: int  # training sequences: 1 unless a call broke the prefix
    sampled_tokens: int
    link: str  # the rollout's page in the viewer


COLUMNS = list(RolloutSample.model_fields)


def viewer_link(base: str | None, rollout_id: str) -> str:
    """The rollout's page under the viewer's address `base`; without one, its path on the viewer."""
    return f"{(base or '').rstrip('/')}/rollouts/{rollout_id}"


def pick_samples(groups: Sequence[TrainGroup], step: int, viewer_url: str | None) -> list[RolloutSample]:
    """Per harness (in name order): its best rollout (the highest reward; the first of equal ones), its worst
    (the lowest; the last of equal ones), and one of the others at random, each once."""
    by: dict[str, list[tuple[TrainGroup, TrainRollout]]] = {}
    for g in groups:
        by.setdefault(g.harness, []).extend((g, r) for r in g.rollouts)
    draw = random.Random(step)
    out = []
    for harness, rollouts in sorted(by.items()):
        best = max(range(len(rollouts)), key=lambda i: (rollouts[i][1].reward, -i))
        worst = min(range(len(rollouts)), key=lambda i: (rollouts[i][1].reward, -i))
        rest = [i for i in range(len(rollouts)) if i not in (best, worst)]
        picks: list[tuple[Literal["best", "worst", "random"], int]] = [("best", best)]
        if worst != best:
            picks.append(("worst", worst))
        if rest:
            picks.append(("random", draw.choice(rest)))
        for pick, i in picks:
            g, r = rollouts[i]
            out.append(RolloutSample(step=step, harness=harness, pick=pick, rollout_id=r.rollout_id, task_id=g.task_id,
                                     reward=r.reward, advantage=r.advantage, sequences=len(r.sequences),
                                     sampled_tokens=sum(s.num_sampled for s in r.sequences),
                                     link=viewer_link(viewer_url, r.rollout_id)))
    return out


def table_rows(samples: Sequence[RolloutSample]) -> list[list[Any]]:
    """The samples as a table's rows, in COLUMNS order."""
    return [[getattr(s, c) for c in COLUMNS] for s in samples]


def markdown(samples: Sequence[RolloutSample]) -> str:
    """A markdown table (TensorBoard's text plugin renders one), each rollout id a link to its page."""
    lines = ["| " + " | ".join(COLUMNS[:-1]) + " |", "|" + "---|" * (len(COLUMNS) - 1)]
    for s in samples:
        cells = [str(s.step), s.harness, s.pick, f"[{s.rollout_id}]({s.link})", s.task_id, f"{s.reward:.4f}",
                 f"{s.advantage:+.4f}", str(s.sequences), str(s.sampled_tokens)]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)
