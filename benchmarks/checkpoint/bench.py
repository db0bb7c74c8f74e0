"""What a checkpoint after every step costs the training loop: the learner's own `checkpoint()` (a snapshot, then
the write while the next step trains) against the same checkpoint awaited before the next step (the write on
the step's path), and against no checkpoint at all. One command runs all three on the
same model, batch and volume, so the figures are ratios against a baseline run beside them.

    python benchmarks/checkpoint/bench.py --out benchmarks/checkpoint/results.json     # this CPU: ~3 min
    python benchmarks/checkpoint/bench.py --tiny --steps 2 --rounds 1 --out tiny.json  # make test's smoke run

The model is a random-initialised Qwen2-shaped one built in a temporary directory (no network), fully
fine-tuned (fp32 weights and AdamW state: a checkpoint writes 12 bytes per parameter), so the write is large
beside a short step, as it is for a full fine-tune on a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import torch
from harnessrl.runtime.contracts.learner_config import LearnerConfig
from harnessrl.runtime.learner.loop import Learner
from harnessrl.runtime.learner.packing import Sample
from harnessrl.runtime.trajectory.models import TrainingSequence

SHAPES: dict[str, dict[str, int]] = {
    # ~59M parameters: a 0.7 GB checkpoint.
    "small": {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 8,
              "num_key_value_heads": 4, "vocab_size": 16384},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "vocab_size": 256},
}
MODES = ("none", "inline", "background")


def build_model(shape: str, out: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=False,
                         eos_token_id=1, pad_token_id=0)
    Qwen2ForCausalLM(config).save_pretrained(out)
    return out


def learner_config(model: Path, work: Path) -> LearnerConfig:
    (work / "admin-token").write_text("bench")
    (work / "runner-token").write_text("bench")
    return LearnerConfig.model_validate({
        "model": {"path": str(model), "served_name": "bench", "device": "cpu"},
        "adapter": {"kind": "full"},
        "grpo": {"group_size": 2, "groups_per_step": 1, "steps": 1_000_000, "lr": 1e-5},
        "harnesses": [{"pool": "p", "harness": "h"}],
        "tasks": {"ids": ["t"]},
        "proxy": {"url": "http://127.0.0.1:9", "admin_token_file": str(work / "admin-token")},
        "engine": {"urls": ["http://127.0.0.1:9/v1"], "sync": "restart"},
        "checkpoint": {"dir": str(work / "ck"), "every": 1, "keep": 2},
        "tracking": {"report_to": []},
        "runner_token_file": str(work / "runner-token"),
    })


def batch(vocab: int, sequences: int, seq_len: int) -> list[Sample]:
    g = torch.Generator().manual_seed(1)
    prompt = seq_len // 2
    out = []
    for i in range(sequences):
        ids = torch.randint(2, vocab, (seq_len,), generator=g).tolist()
        seq = TrainingSequence(session_id=f"s{i}", node_ids=[0], token_ids=ids,
                               loss_mask=[0] * prompt + [1] * (seq_len - prompt),
                               logprobs=[0.0] * prompt + [-5.0] * (seq_len - prompt), policy_versions=[0] * seq_len)
        out.append(Sample(sequence=seq, advantage=1.0 if i % 2 else -1.0))
    return out


async def timed_steps(learner: Learner, samples: list[Sample], steps: int, mode: str) -> list[float]:
    """Seconds of each step of the loop: train, then (per `mode`) checkpoint; the last write is awaited and
    counted in the last step."""
    state = learner.coordinator.state
    seconds = []
    for i in range(steps):
        t0 = time.perf_counter()
        await asyncio.to_thread(learner.trainer.step, samples)
        state.step += 1
        if mode != "none":
            await learner.checkpoint()
        if learner.writing is not None and (mode == "inline" or i == steps - 1):
            await learner.checkpoint_written()
        seconds.append(time.perf_counter() - t0)
    return seconds


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


async def measure(learner: Learner, samples: list[Sample], steps: int, rounds: int) -> dict[str, Any]:
    """In one event loop, as the learner's: a warm-up step (AdamW's state exists from here on), the snapshot and
    the write timed apart (the snapshot is on the step's path either way), then `rounds` times `steps` steps
    per mode, the modes in turn (so that a drift of the machine's speed falls on all of them)."""
    await timed_steps(learner, samples, 1, "inline")
    snapshot_s = await timed(learner.checkpoint)
    write_s = await timed(learner.checkpoint_written)
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            results[mode] += await timed_steps(learner, samples, steps, mode)
    return {"snapshot_s": snapshot_s, "write_s": write_s, "step_s_each": results}


def run(shape: str, steps: int, rounds: int, sequences: int, seq_len: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="harnessrl-ckbench-") as tmp:
        work = Path(tmp)
        learner = Learner(learner_config(build_model(shape, work / "model"), work))
        model = learner.trainer.trainer.model
        samples = batch(model.config.vocab_size, sequences, seq_len)
        measured = asyncio.run(measure(learner, samples, steps, rounds))
        last_checkpoint = (work / "ck" / "latest").read_text()
        checkpoint_bytes = sum(f.stat().st_size for f in (work / "ck" / last_checkpoint).rglob("*") if f.is_file())
        learner.journal.close()
    per_step = {mode: sum(s) / len(s) for mode, s in measured["step_s_each"].items()}
    return {
        "shape": shape,
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokens_per_step": sequences * seq_len,
        "steps": steps,
        "rounds": rounds,
        "checkpoint_bytes": checkpoint_bytes,
        "last_checkpoint": last_checkpoint,
        "snapshot_s": measured["snapshot_s"],
        "write_s": measured["write_s"],
        "step_s": per_step,
        "step_s_each": measured["step_s_each"],
        # The cost of checkpointing every step, as a multiple of a step without checkpoints.
        "vs_no_checkpoint": {mode: per_step[mode] / per_step["none"] for mode in ("inline", "background")},
        "inline_over_background": per_step["inline"] / per_step["background"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="the tiny shape (a smoke run)")
    ap.add_argument("--steps", type=int, default=4, help="measured steps per mode and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the three modes in turn")
    ap.add_argument("--sequences", type=int, default=4, help="sequences per step")
    ap.add_argument("--seq-len", type=int, default=256, help="tokens per sequence")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    report = run("tiny" if args.tiny else "small", args.steps, args.rounds, args.sequences, args.seq_len)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    report["machine"] = {"platform": platform.platform(), "cpus": torch.get_num_threads(), "commit": commit,
                         "command": " ".join(["python", "benchmarks/checkpoint/bench.py", *(argv or sys.argv[1:])])}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['parameters']:,} parameters, checkpoint {report['checkpoint_bytes'] / 2**20:,.0f} MiB "
          f"(snapshot {report['snapshot_s']:.2f} s, write {report['write_s']:.2f} s)")
    for mode in MODES:
        print(f"  {mode:>10}: {report['step_s'][mode]:.2f} s per step")
    print(f"  checkpoint every step: inline {report['vs_no_checkpoint']['inline']:.2f}x, background "
          f"{report['vs_no_checkpoint']['background']:.2f}x a step without; inline/background "
          f"{report['inline_over_background']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
