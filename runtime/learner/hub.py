"""Export checkpoints to the Hugging Face Hub: repo, one branch per checkpoint, a model card with the metrics.

The token is read from the file or env var named in the config at each export and handed only to
huggingface_hub; it is never logged, formatted into an error, or written next to the files.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from harnessrl.runtime.contracts.coordinator import EvalRecord, PoolScore
from harnessrl.runtime.learner.checkpoint import CheckpointMeta
from harnessrl.runtime.learner.config import HubExport
from harnessrl.runtime.learner.evaluation import read_records
from harnessrl.runtime.learner.metrics import StepMetrics

log = logging.getLogger(__name__)


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.4f}"


def model_card(run_name: str, meta: CheckpointMeta, history: list[StepMetrics], base_model: str,
               evals: Sequence[EvalRecord] = ()) -> str:
    """README.md: front matter, the run's latest metrics, held-out pass@1 per harness from the evaluation rounds
    up to this checkpoint (base policy first), training pass@1 per harness, and a step table."""
    last = history[-1] if history else None
    window = history[-10:]
    harnesses = sorted({h for m in window for h in m.solved_rate_by_harness})
    lines = [
        "---",
        "library_name: peft" if meta.adapter_kind == "lora" else "library_name: transformers",
        "tags: [harnessrl, grpo, reinforcement-learning]",
        "---",
        "",
        f"# {run_name} — step {meta.step}",
        "",
        f"Trained with harnessrl (GRPO inside agent harnesses) from `{base_model}`; "
        f"policy version {meta.policy_version} ({meta.adapter_kind}).",
        "",
        "## Metrics",
        "",
        "| metric | value |",
        "|---|---|",
        f"| step | {meta.step} |",
        f"| policy_version | {meta.policy_version} |",
    ]
    if last is not None:
        lines += [
            f"| mean_reward | {_fmt(last.mean_reward)} |",
            f"| mean_reward_last_10_steps | {_fmt(_avg([m.mean_reward for m in window]))} |",
            f"| rollouts_scored | {last.rollouts_scored} |",
            f"| rollouts_unscored | {last.rollouts_unscored} |",
            f"| rollouts_stale | {last.rollouts_stale} |",
            f"| loss | {_fmt(last.loss)} |",
            f"| clip_fraction | {_fmt(last.clip_fraction)} |",
            f"| kl | {_fmt(last.kl)} |",
            f"| tokens_per_s | {last.tokens_per_s:.1f} |",
        ]
    lines += held_out_table([r for r in evals if r.step <= meta.step])
    lines += ["", "## pass@1 per harness (training rollouts, last 10 steps)", "", "| harness | pass@1 | mean reward |", "|---|---|---|"]
    for h in harnesses:
        solved = _avg([m.solved_rate_by_harness.get(h) for m in window])
        reward = _avg([m.mean_reward_by_harness.get(h) for m in window])
        lines.append(f"| {h} | {_fmt(solved)} | {_fmt(reward)} |")
    lines += ["", "## Steps", "", "| step | mean reward | loss | kl |", "|---|---|---|---|"]
    lines += [f"| {m.step} | {_fmt(m.mean_reward)} | {_fmt(m.loss)} | {_fmt(m.kl)} |" for m in history[-50:]]
    return "\n".join(lines) + "\n"


def held_out_table(rounds: list[EvalRecord]) -> list[str]:
    """Held-out pass@1 per harness (rows) at each evaluation round (columns: the base policy at step 0, then the
    checkpoints), each with its counts and 95% Wilson interval; nothing when the run has no evaluation."""
    if not rounds:
        return []
    pools = list(dict.fromkeys(s.pool for r in rounds for s in r.pools))
    heads = ["base (step 0)" if r.step == 0 else f"step {r.step}" for r in rounds]

    def cell(score: PoolScore | None) -> str:
        if score is None or score.pass_at_1 is None:
            return "–"
        lo, hi = score.interval()
        return f"{score.pass_at_1:.2f} ({score.solved}/{score.scored}, 95% CI {lo:.2f}–{hi:.2f})"

    lines = ["", f"## Held-out pass@1 per harness ({rounds[-1].tasks} tasks × {rounds[-1].attempts} attempts)", "",
             "| harness pool | " + " | ".join(heads) + " |", "|---|" + "---|" * len(rounds)]
    for pool in pools:
        cells = [cell(next((s for s in r.pools if s.pool == pool), None)) for r in rounds]
        lines.append(f"| {pool} | " + " | ".join(cells) + " |")
    return lines


def _avg(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


class HubExporter:
    def __init__(self, cfg: HubExport, run_name: str, base_model: str = "", eval_file: Path | None = None):
        self.cfg = cfg
        self.run_name = run_name
        self.base_model = base_model or run_name
        self.every = cfg.every
        self.eval_file = eval_file  # the run's eval.jsonl, read at each export for the model card

    def export(self, checkpoint: Path, history: list[StepMetrics]) -> str:
        """Upload `checkpoint`'s policy, metrics and a model card to branch `<prefix><step>`; return it."""
        from huggingface_hub import HfApi

        meta = CheckpointMeta.model_validate_json((checkpoint / "meta.json").read_text())
        revision = f"{self.cfg.revision_prefix}{meta.step}"
        api = HfApi(endpoint=self.cfg.endpoint, token=self.cfg.read_token())
        api.create_repo(self.cfg.repo, private=self.cfg.private, exist_ok=True)
        api.create_branch(self.cfg.repo, branch=revision, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="hub-export-") as tmp:
            staging = Path(tmp)
            shutil.copytree(checkpoint / "policy", staging, dirs_exist_ok=True)
            if (checkpoint / "metrics.jsonl").exists():
                shutil.copyfile(checkpoint / "metrics.jsonl", staging / "metrics.jsonl")
            evals = read_records(self.eval_file) if self.eval_file is not None else []
            (staging / "README.md").write_text(model_card(self.run_name, meta, history, self.base_model, evals))
            api.upload_folder(
                repo_id=self.cfg.repo,
                folder_path=staging,
                revision=revision,
                commit_message=f"{self.run_name}: step {meta.step} (policy v{meta.policy_version})",
            )
        return revision
