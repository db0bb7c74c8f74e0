"""benchmarks/learner/bench.py on CPU with the tiny shape: every figure of the report is computed from what ran
(tokens, seconds, the shape's FLOPs), the learner's own step trains, and the standalone step (for machines
without harnessrl) computes the same gradient as the learner's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "learner"))
import bench

pytestmark = pytest.mark.slow


def by_case(report: dict) -> dict[tuple[str, int], dict]:
    return {(c["adapter"], c["seq_len"]): c for c in report["cases"]}


def test_tiny_run_reports_computed_figures(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert bench.main(["--tiny", "--seq-lens", "32,48", "--steps", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    cases = by_case(report)
    assert set(cases) == {("full", 32), ("full", 48), ("lora", 32), ("lora", 48)}
    # The tiny shape by hand: 2 layers of d=64, f=128, 2 query heads and 1 kv head of 32, vocab 256.
    linear = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128) + 64 * 256
    assert report["linear_params"] == linear
    for (adapter, seq_len), c in cases.items():
        assert c["step"] == "learner" and c["error"] is None
        assert c["tokens"] == 2 * seq_len
        attention = 2 * 2 * seq_len * 64  # 2 layers, 2 query heads of 32, causal
        assert c["model_flops"] == 2 * ((3 if adapter == "full" else 2) * 2 * linear + 3 * attention) * seq_len
        assert c["seconds"] > 0
        assert c["tokens_per_s"] == pytest.approx(c["tokens"] / c["seconds"])
        assert c["mfu"] == pytest.approx(c["model_flops"] / c["seconds"] / 989.4e12)
        assert c["peak_memory_bytes"] > 0 and c["grad_norm"] > 0


def test_standalone_step_matches_the_learners_gradient(tmp_path: Path) -> None:
    learner, standalone = tmp_path / "learner.json", tmp_path / "standalone.json"
    assert bench.main(["--tiny", "--seq-lens", "40", "--steps", "1", "--out", str(learner)]) == 0
    assert bench.main(["--tiny", "--seq-lens", "40", "--steps", "1", "--standalone", "--out", str(standalone)]) == 0
    ours, theirs = by_case(json.loads(learner.read_text())), by_case(json.loads(standalone.read_text()))
    for key, c in theirs.items():
        assert c["step"] == "standalone"
        assert c["grad_norm"] == pytest.approx(ours[key]["grad_norm"], rel=1e-4)


def test_each_case_carries_the_operators_plan_for_its_published_shape() -> None:
    """The plan a GPU run calibrates is the operator's own for that model: the bench's shapes are the published
    configs the operator knows (runtime/contracts/learner_memory.py KNOWN_SHAPES), and the headline fits an 80 GB H100."""
    from harnessrl.runtime.contracts.learner_memory import KNOWN_SHAPES, TrainingSetup, plan_memory

    for shape, repo in (("1.7b", "Qwen/Qwen3-1.7B"), ("4b", "Qwen/Qwen3-4B"), ("8b", "Qwen/Qwen3-8B")):
        for adapter, rank in (("full", None), ("lora", 16)):
            setup = TrainingSetup(lora_rank=rank, micro_batch_tokens=16384, max_sequence_tokens=16384,
                                  gradient_checkpointing=True, gpus=1, gpu_memory_bytes=1)
            assert bench.planned_peak(shape, adapter, 16384) == plan_memory(KNOWN_SHAPES[repo], setup).peak
    shape, adapter, tokens = bench.HEADLINE
    assert bench.planned_peak(shape, adapter, tokens) < 80 * 10**9
