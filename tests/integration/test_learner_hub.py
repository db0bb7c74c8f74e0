"""Hub export against the local Hub stand-in (tests/fixtures/hub_server.py, speaking the Hub's HTTP protocol):
the repo is created, each checkpoint lands on its own branch with the adapter, metrics and a model card, main
holds the best exported checkpoint by held-out pass@1 (the newest without evaluations), the files download back
intact, and the token never reaches a log."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch
from harnessrl.runtime.contracts.coordinator import EvalRecord, PoolScore
from harnessrl.runtime.contracts.learner_config import HubExport
from harnessrl.runtime.learner.checkpoint import take_snapshot, write_checkpoint
from harnessrl.runtime.learner.coordinator import CoordinatorState
from harnessrl.runtime.learner.hub import HubExporter
from harnessrl.runtime.learner.metrics import StepMetrics

from tests.fixtures.hub_server import HubServer


def metrics(step: int) -> StepMetrics:
    return StepMetrics(step=step, policy_version=step, time=time.time(), rollouts_scored=8 * step, rollouts_unscored=1,
                       rollouts_stale=0, groups_trained=step, groups_zero_variance=0, mean_reward=0.1 * step,
                       mean_reward_by_harness={"mini-swe-agent": 0.1 * step, "claude-code": 0.05 * step},
                       solved_rate_by_harness={"mini-swe-agent": 0.125 * step, "claude-code": 0.25},
                       loss=-0.01, clip_fraction=0.02, kl=0.001, tokens=1000, loss_tokens=400, tokens_per_s=123.0,
                       step_s=1.0, sync_s=0.1, grad_norm=0.5)


def eval_round(step: int, solved: int) -> EvalRecord:
    score = PoolScore(pool="oneshot", harness="oneshot", rollouts=16, scored=16, solved=solved, unscored=0,
                      pending=0, pass_at_1=solved / 16, mean_correctness=solved / 16)
    return EvalRecord(step=step, policy_version=step, model=f"tiny-v{step}", time=0.0, tasks=4, attempts=4,
                      pools=[score])


def tiny_lora() -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1,
                      num_key_value_heads=1)
    return get_peft_model(Qwen2ForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


def test_export_creates_repo_branches_files_and_card(
    hub_server: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)  # huggingface_hub and httpx included: the token must not show at any level
    monkeypatch.setenv("HF_HUB_TOKEN_FOR_TEST", hub_server.token)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    cfg = HubExport(repo="acme/tiny-grpo", token_env="HF_HUB_TOKEN_FOR_TEST", endpoint=hub_server.endpoint,
                    run_spec="grpo:\n  steps: 4\n")
    evals = tmp_path / "eval.jsonl"
    # The base policy's round, and rounds at steps 2 and 4: each card shows the rounds up to its own step.
    evals.write_text("".join(eval_round(step, solved).model_dump_json() + "\n" for step, solved in ((0, 3), (2, 12), (4, 16))))
    exporter = HubExporter(cfg, "run-a", "tiny-base", evals)
    model = tiny_lora()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    history = []
    revisions = []
    for step in (2, 4):
        history += [metrics(step - 1), metrics(step)]
        mfile = tmp_path / "metrics.jsonl"
        mfile.write_text("".join(m.model_dump_json() + "\n" for m in history))
        state = CoordinatorState(step=step, policy_version=step, policy_model=f"tiny-v{step}")
        ck = write_checkpoint(tmp_path / "ck", model, take_snapshot(state, model.state_dict(), opt.state_dict(), mfile),
                              "lora", keep=3)
        revisions.append(exporter.export(ck, history))
    assert revisions == ["step-2", "step-4"]

    from huggingface_hub import HfApi, hf_hub_download

    api = HfApi(endpoint=hub_server.endpoint, token=hub_server.token)
    refs = {b.name for b in api.list_repo_refs("acme/tiny-grpo").branches}
    assert {"main", "step-2", "step-4"} <= refs
    files = set(api.list_repo_files("acme/tiny-grpo", revision="step-4"))
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "metrics.jsonl"} <= files
    card_path = hf_hub_download("acme/tiny-grpo", "README.md", revision="step-4", token=hub_server.token,
                                endpoint=hub_server.endpoint, cache_dir=tmp_path / "cache")
    card = Path(card_path).read_text()
    assert "# run-a — step 4" in card
    assert "| mean_reward | 0.4000 |" in card
    assert "| mini-swe-agent | 0.3125 | 0.2500 |" in card  # pass@1 and reward averaged over the last steps
    assert "| claude-code | 0.2500 |" in card
    assert card.endswith("## Training spec\n\n```yaml\ngrpo:\n  steps: 4\n```\n")  # how this checkpoint was trained
    # Held-out pass@1 from the evaluation rounds, base first, with counts and the 95% Wilson interval.
    assert "## Held-out pass@1 per harness (4 tasks × 4 attempts)" in card
    assert "| harness pool | base (step 0) | step 2 | step 4 |" in card
    assert "| oneshot | 0.19 (3/16, 95% CI 0.07–0.43) | 0.75 (12/16, 95% CI 0.51–0.90) | 1.00 (16/16, 95% CI 0.81–1.00) |" in card
    step2 = Path(hf_hub_download("acme/tiny-grpo", "README.md", revision="step-2", token=hub_server.token,
                                 endpoint=hub_server.endpoint, cache_dir=tmp_path / "cache2")).read_text()
    assert "| harness pool | base (step 0) | step 2 |" in step2 and "step 4 |" not in step2
    adapter = hf_hub_download("acme/tiny-grpo", "adapter_model.safetensors", revision="step-2",
                              token=hub_server.token, endpoint=hub_server.endpoint, cache_dir=tmp_path / "cache")
    local = tmp_path / "ck" / "step-0000002" / "policy" / "adapter_model.safetensors"
    assert Path(adapter).read_bytes() == local.read_bytes()
    assert hub_server.state.repos["acme/tiny-grpo"].private
    assert hub_server.state.auth_failures == 0
    # The token: on every request to the Hub, in no log record and no output.
    assert any(r.startswith("POST /api/models/acme/tiny-grpo/commit/step-") for r in hub_server.state.requests)
    out, err = capfd.readouterr()
    logged = caplog.text + out + err + "".join(str(r.__dict__) for r in caplog.records)
    assert caplog.records  # the capture did see the client's debug logs
    assert hub_server.token not in logged


def test_export_refuses_a_missing_token(hub_server: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_TOKEN_VAR", raising=False)
    cfg = HubExport(repo="acme/x", token_env="NO_SUCH_TOKEN_VAR", endpoint=hub_server.endpoint)
    (tmp_path / "meta.json").write_text('{"step":1,"policy_version":1,"policy_model":"m","adapter_kind":"lora","written_at":0}')
    with pytest.raises(ValueError, match="NO_SUCH_TOKEN_VAR is empty or missing"):
        HubExporter(cfg, "r").export(tmp_path, [])
    assert hub_server.state.requests == []


def download(hub: HubServer, filename: str, revision: str, cache: Path) -> bytes:
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download("acme/tiny-grpo", filename, revision=revision, token=hub.token, endpoint=hub.endpoint,
                                cache_dir=cache)).read_bytes()


def export_steps(hub: HubServer, tmp_path: Path, rounds: dict[int, int], steps: list[int], evals: bool = True) -> None:
    """Train-like exports: each step's weights differ, and its evaluation round (solved of 16, when it has one)
    is recorded before its export, as the learner does."""
    cfg = HubExport(repo="acme/tiny-grpo", token_env="HF_HUB_TOKEN_FOR_TEST", endpoint=hub.endpoint)
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(eval_round(0, 4).model_dump_json() + "\n")  # the base policy's round
    exporter = HubExporter(cfg, "run-b", "tiny-base", eval_file if evals else None)
    model = tiny_lora()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    history: list[StepMetrics] = []
    for step in steps:
        with torch.no_grad():
            next(p for p in model.parameters() if p.requires_grad).add_(0.01)
        history.append(metrics(step))
        state = CoordinatorState(step=step, policy_version=step, policy_model=f"tiny-v{step}")
        snapshot = take_snapshot(state, model.state_dict(), opt.state_dict(), tmp_path / "none")
        ck = write_checkpoint(tmp_path / "ck", model, snapshot, "lora", keep=len(steps))
        if step in rounds:
            with eval_file.open("a") as f:
                f.write(eval_round(step, rounds[step]).model_dump_json() + "\n")
        exporter.export(ck, history)


def local_adapter(tmp_path: Path, step: int) -> bytes:
    return (tmp_path / "ck" / f"step-{step:07d}" / "policy" / "adapter_model.safetensors").read_bytes()


def test_main_holds_the_best_exported_step_and_says_why(
    hub_server: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_TOKEN_FOR_TEST", hub_server.token)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    # Step 4 is the best (16/16); step 6 collapses (2/16); step 8 is not evaluated.
    export_steps(hub_server, tmp_path, {2: 8, 4: 16, 6: 2}, [2, 4, 6, 8])
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_server.endpoint, token=hub_server.token)
    assert {b.name for b in api.list_repo_refs("acme/tiny-grpo").branches} == {"main", "step-2", "step-4", "step-6",
                                                                                "step-8"}
    # main: step 4's files, not the last step's; every step still on its own branch.
    assert download(hub_server, "adapter_model.safetensors", "main", tmp_path / "c1") == local_adapter(tmp_path, 4)
    for step in (6, 8):
        assert download(hub_server, "adapter_model.safetensors", f"step-{step}", tmp_path / f"c{step}") == \
            local_adapter(tmp_path, step) != local_adapter(tmp_path, 4)
    assert set(api.list_repo_files("acme/tiny-grpo")) == set(api.list_repo_files("acme/tiny-grpo", revision="step-4"))
    card = download(hub_server, "README.md", "main", tmp_path / "c2").decode()
    assert "# run-b — step 4" in card and "| step | 4 |" in card
    assert "`main` holds step 4: of the exported checkpoints, the best by held-out pass@1 (the mean over the eval " \
           "pools; of equal ones, the earliest), 1.00 (oneshot 1.00)." in card
    assert "Step 6, the latest evaluated, scored 0.12 (oneshot 0.12)." in card
    assert "| harness pool | base (step 0) | step 2 | step 4 | step 6 |" in card  # the later rounds too
    # main moved forward (2, then 4) and then stayed: steps 6 and 8 changed only its card.
    main = [c.message for c in hub_server.state.repos["acme/tiny-grpo"].commits.values()
            if c.message.startswith("run-b: main")]
    assert main == ["run-b: main holds step 2 (policy v2)", "run-b: main holds step 4 (policy v4)",
                    "run-b: main holds step 4 (policy v4)"]


def test_without_evaluations_main_holds_the_newest_step(
    hub_server: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_TOKEN_FOR_TEST", hub_server.token)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    export_steps(hub_server, tmp_path, {}, [2, 4], evals=False)
    assert download(hub_server, "adapter_model.safetensors", "main", tmp_path / "c1") == local_adapter(tmp_path, 4)
    main_card = download(hub_server, "README.md", "main", tmp_path / "c2")
    assert main_card == download(hub_server, "README.md", "step-4", tmp_path / "c3")  # the step's own card
    assert b"Why this checkpoint" not in main_card
