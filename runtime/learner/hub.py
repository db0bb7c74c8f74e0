"""Export checkpoints to the Hugging Face Hub: repo, one branch per checkpoint, a model card with the metrics, and
`main` holding the best exported checkpoint by held-out pass@1 (evaluation.best_round; the newest without
evaluations), with a card that says which step it is and why.

The token is read from the file or env var named in the config at each export and handed only to
huggingface_hub; it is never logged, formatted into an error, or written next to the files.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harnessrl.runtime.contracts.coordinator import EvalRecord, PoolScore
from harnessrl.runtime.contracts.learner_config import HubExport
from harnessrl.runtime.learner.checkpoint import CheckpointMeta
from harnessrl.runtime.learner.evaluation import best_round, mean_pass_at_1, read_records
from harnessrl.runtime.learner.metrics import StepMetrics

if TYPE_CHECKING:
    from huggingface_hub import CommitOperation, HfApi

log = logging.getLogger(__name__)


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.4f}"


def model_card(run_name: str, step: int, policy_version: int, adapter_kind: str, history: list[StepMetrics],
               base_model: str, evals: Sequence[EvalRecord] = (), why: Sequence[str] = (), run_spec: str = "") -> str:
    """README.md: front matter, `why` (main's reason for holding this step), the metrics of the history's last
    step, held-out pass@1 per harness from the evaluation rounds `evals` (base policy first), training pass@1 per
    harness, a step table and the TrainingRun's spec (`run_spec`, YAML)."""
    last = history[-1] if history else None
    window = history[-10:]
    harnesses = sorted({h for m in window for h in m.solved_rate_by_harness})
    lines = [
        "---",
        "library_name: peft" if adapter_kind == "lora" else "library_name: transformers",
        "tags: [harnessrl, grpo, reinforcement-learning]",
        "---",
        "",
        f"# {run_name} — step {step}",
        "",
        f"Trained with harnessrl (GRPO inside agent harnesses) from `{base_model}`; "
        f"policy version {policy_version} ({adapter_kind}).",
        *why,
        "",
        "## Metrics",
        "",
        "| metric | value |",
        "|---|---|",
        f"| step | {step} |",
        f"| policy_version | {policy_version} |",
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
    lines += held_out_table(list(evals))
    lines += ["", "## pass@1 per harness (training rollouts, last 10 steps)", "", "| harness | pass@1 | mean reward |", "|---|---|---|"]
    for h in harnesses:
        solved = _avg([m.solved_rate_by_harness.get(h) for m in window])
        reward = _avg([m.mean_reward_by_harness.get(h) for m in window])
        lines.append(f"| {h} | {_fmt(solved)} | {_fmt(reward)} |")
    lines += ["", "## Steps", "", "| step | mean reward | loss | kl |", "|---|---|---|---|"]
    lines += [f"| {m.step} | {_fmt(m.mean_reward)} | {_fmt(m.loss)} | {_fmt(m.kl)} |" for m in history[-50:]]
    if run_spec:
        lines += ["", "## Training spec", "", "```yaml", run_spec.rstrip("\n"), "```"]
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


def why_main(best: EvalRecord, latest: EvalRecord, revision_prefix: str) -> list[str]:
    """The card's section on main: which step it holds and why, against the latest evaluation."""
    def score(r: EvalRecord) -> str:
        mean = mean_pass_at_1(r)
        pools = ", ".join(f"{pool} {p:.2f}" for pool, p in r.pass_at1().items())
        return "no scored attempt" if mean is None else f"{mean:.2f} ({pools})"

    lines = ["", "## Why this checkpoint", ""]
    if best.validation:
        lines.append(f"`main` holds step {best.step}: of the exported checkpoints, the best by validation pass@1 (the "
                     f"mean over the eval pools; of equal ones, the earliest), "
                     f"{_fmt(mean_pass_at_1(best, validation=True))}; on the held-out test split, which played no "
                     f"part in the choice, it scores {score(best)}.")
    else:
        lines.append(f"`main` holds step {best.step}: of the exported checkpoints, the best by held-out pass@1 (the "
                     f"mean over the eval pools; of equal ones, the earliest), {score(best)}.")
    if latest.step != best.step:
        lines.append(f"Step {latest.step}, the latest evaluated, scored {score(latest)}.")
    lines.append(f"Every exported step stays on its own branch, `{revision_prefix}<step>`.")
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
        self.eval_file = eval_file  # the run's eval.jsonl, read at each export for the cards and main's checkpoint

    def export(self, checkpoint: Path, history: list[StepMetrics]) -> str:
        """Upload `checkpoint`'s policy, metrics and a model card to branch `<prefix><step>`, then point main at the
        best exported checkpoint; return the branch."""
        from huggingface_hub import HfApi

        meta = CheckpointMeta.model_validate_json((checkpoint / "meta.json").read_text())
        revision = f"{self.cfg.revision_prefix}{meta.step}"
        api = HfApi(endpoint=self.cfg.endpoint, token=self.cfg.read_token())
        api.create_repo(self.cfg.repo, private=self.cfg.private, exist_ok=True)
        api.create_branch(self.cfg.repo, branch=revision, exist_ok=True)
        evals = read_records(self.eval_file) if self.eval_file is not None else []
        with tempfile.TemporaryDirectory(prefix="hub-export-") as tmp:
            staging = Path(tmp)
            shutil.copytree(checkpoint / "policy", staging, dirs_exist_ok=True)
            if (checkpoint / "metrics.jsonl").exists():
                shutil.copyfile(checkpoint / "metrics.jsonl", staging / "metrics.jsonl")
            card = model_card(self.run_name, meta.step, meta.policy_version, meta.adapter_kind, history,
                              self.base_model, [r for r in evals if r.step <= meta.step], run_spec=self.cfg.run_spec)
            (staging / "README.md").write_text(card)
            api.upload_folder(
                repo_id=self.cfg.repo,
                folder_path=staging,
                revision=revision,
                # The branch starts from main, which holds another step's files: it must hold only this one's.
                delete_patterns="*",
                commit_message=f"{self.run_name}: step {meta.step} (policy v{meta.policy_version})",
            )
        self._point_main(api, meta, history, evals)
        return revision

    def _point_main(self, api: HfApi, newest: CheckpointMeta, history: list[StepMetrics],
                   evals: list[EvalRecord]) -> None:
        """Make main hold the files of the best exported step's branch (`newest` without evaluated exports), with
        its own card. Unchanged files are not committed again: when main already holds that step, only its card
        can change (the latest evaluation it names)."""
        from huggingface_hub import CommitOperationAdd, CommitOperationCopy, CommitOperationDelete

        repo, prefix = self.cfg.repo, self.cfg.revision_prefix
        branch = re.compile(re.escape(prefix) + r"(\d+)")
        exported = {int(m[1]) for ref in api.list_repo_refs(repo).branches if (m := branch.fullmatch(ref.name))}
        best = best_round(evals, exported)
        step, version = (best.step, best.policy_version) if best is not None else (newest.step, newest.policy_version)
        source = f"{prefix}{step}"
        files = set(api.list_repo_files(repo, revision=source)) - {".gitattributes", "README.md"}
        stale = set(api.list_repo_files(repo)) - files - {".gitattributes", "README.md"}
        why = why_main(best, max(evals, key=lambda r: r.step), prefix) if best is not None else []
        card = model_card(self.run_name, step, version, newest.adapter_kind, [m for m in history if m.step <= step],
                          self.base_model, evals, why, self.cfg.run_spec)
        # A copy within the repo: the Hub copies large (LFS) files server-side, nothing is uploaded again.
        operations: list[CommitOperation] = [
            *(CommitOperationCopy(src_path_in_repo=f, path_in_repo=f, src_revision=source) for f in sorted(files)),
            *(CommitOperationDelete(path_in_repo=f) for f in sorted(stale)),
            CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card.encode()),
        ]
        api.create_commit(repo, operations, revision="main",
                          commit_message=f"{self.run_name}: main holds step {step} (policy v{version})")
        log.info("Hub main holds step %d%s", step, "" if best is None else " (best held-out pass@1)")
