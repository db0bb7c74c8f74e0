"""`harnessrl eval` before anything starts: which checkpoints, pools, tasks; errors in the user's terms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harnessrl.runtime.contracts.engine_config import EngineConfig

from harnessrl.local import evaluate as ev

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart"
RUN_FILE = QUICKSTART / "trainingrun.yaml"


def adapter(dir_: Path, rank: int = 8) -> Path:
    dir_.mkdir(parents=True)
    (dir_ / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    return dir_


def learner_checkpoints(root: Path) -> Path:
    """The learner's layout: <root>/step-N/{policy/, meta.json} and <root>/latest."""
    for step, version in ((10, 10), (20, 20)):
        step_dir = root / f"step-{step:07d}"
        adapter(step_dir / "policy")
        (step_dir / "meta.json").write_text(json.dumps({"step": step, "policy_version": version}))
    (root / "latest").write_text("step-0000020")
    return root


def test_base_needs_no_directory() -> None:
    assert ev.resolve_checkpoint("base") == ev.Checkpoint(label="base", adapter=None)


def test_checkpoint_forms_resolve_to_the_adapter(tmp_path: Path) -> None:
    root = learner_checkpoints(tmp_path / "checkpoints")
    latest = ev.resolve_checkpoint(str(root))
    assert (latest.label, latest.adapter, latest.rank, latest.policy_version) == (
        "step-0000020", root / "step-0000020" / "policy", 8, 20)
    assert ev.resolve_checkpoint(str(root / "step-0000010")).label == "step-0000010"
    policy = ev.resolve_checkpoint(str(root / "step-0000010" / "policy"))
    assert (policy.label, policy.policy_version) == ("step-0000010", 10)
    plain = ev.resolve_checkpoint(str(adapter(tmp_path / "my-adapter", rank=32)))
    assert (plain.label, plain.rank, plain.policy_version) == ("my-adapter", 32, 0)
    # LABEL=...: two runs' checkpoints share step names, so the column can be named.
    named = ev.resolve_checkpoint(f"run-a.s0={root}")
    assert (named.label, named.adapter, named.policy_version) == ("run-a.s0", root / "step-0000020" / "policy", 20)
    assert ev.resolve_checkpoint("before=base").label == "before" and ev.resolve_checkpoint("before=base").adapter is None
    assert [c.label for c in ev.resolve_checkpoints([f"a={root}", f"b={root}"])] == ["a", "b"]


def test_checkpoint_errors_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ev.EvalRunError, match="no such directory"):
        ev.resolve_checkpoint(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ev.EvalRunError, match="no LoRA adapter"):
        ev.resolve_checkpoint(str(tmp_path / "empty"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "config.json").write_text("{}")
    with pytest.raises(ev.EvalRunError, match=r"full weights.*spec\.model\.base"):
        ev.resolve_checkpoint(str(tmp_path / "full"))
    root = learner_checkpoints(tmp_path / "ck")
    with pytest.raises(ev.EvalRunError, match="given twice for step-0000020"):
        ev.resolve_checkpoints([str(root), str(root / "step-0000020")])


def test_tasks_of_the_split_sorted_and_limited() -> None:
    tasks = QUICKSTART / "tasks"
    assert ev.select_tasks(tasks, "test", None) == ["vowel-08", "vowel-09", "vowel-10", "vowel-11"]
    assert ev.select_tasks(tasks, "test", 2) == ["vowel-08", "vowel-09"]
    with pytest.raises(ev.EvalRunError, match="splits train and test"):
        ev.select_tasks(tasks, "validation", None)


def run_main(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = ev.main([str(RUN_FILE), "--out", str(tmp_path / "out"), *extra])
    return code, capsys.readouterr().err


def test_unknown_pool_is_named_with_the_pools_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(tmp_path, capsys, "--checkpoint", "base", "--harness", "codex-pool")
    assert code == 2
    assert "--harness codex-pool: no such HarnessPool" in err and "mini-swe-agent, oneshot" in err


def test_missing_volume_says_which_flag_to_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(tmp_path, capsys, "--checkpoint", "base", "--harness", "oneshot")
    assert code == 2 and "--volume tiny-model=DIR" in err


def test_bad_checkpoint_is_reported_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(tmp_path, capsys, "--checkpoint", str(tmp_path / "nope"))
    assert code == 2 and f"--checkpoint {tmp_path / 'nope'}: no such directory" in err


def test_plan_for_eval_serves_adapters_and_keeps_only_chosen_pools(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    root = learner_checkpoints(tmp_path / "checkpoints")
    args = ev.build_parser().parse_args([
        str(RUN_FILE), "--checkpoint", "base", "--checkpoint", str(root), "--out", str(tmp_path / "out"),
        "--volume", f"tiny-model={model}", "--volume", f"quickstart-tasks={QUICKSTART / 'tasks'}",
        "--harness", "oneshot", "--limit", "2", "--attempts", "3",
    ])
    setup = ev.prepare(args)
    assert [c.label for c in setup.checkpoints] == ["base", "step-0000020"]
    assert setup.task_ids == ["vowel-08", "vowel-09"] and setup.attempts == 3 and setup.split == "test"
    assert [r.pool for r in setup.plan.runners] == ["oneshot"]
    engine = setup.plan.engine.config
    assert isinstance(engine, EngineConfig) and engine.lora.enabled and engine.lora.max_rank >= 8
    assert (tmp_path / "out" / "secrets" / "proxy-admin-token").stat().st_mode & 0o077 == 0
    cfg = ev.eval_config(setup, setup.checkpoints[1], ev.PolicyState(model="tiny-eval-step-0000020", version=20))
    assert cfg.port == setup.coordinator_port and cfg.proxy_url == setup.proxy_url
    assert [p.pool for p in cfg.pools] == ["oneshot"] and cfg.attempts == 3
    # Runners lease from where the eval coordinator listens.
    runner = setup.plan.runners[0].config
    assert str(runner.coordinator_url).rstrip("/") == f"http://127.0.0.1:{setup.coordinator_port}"


def test_finished_results_are_reused_only_for_the_same_evaluation(tmp_path: Path) -> None:
    from harnessrl.runtime.contracts.coordinator import Completion, LeaseRequest, OutcomeKind, PoolHarness
    from harnessrl.runtime.coordinator.service import commit
    from harnessrl.runtime.evaluation.config import EvalConfig
    from harnessrl.runtime.evaluation.coordinator import EvalCoordinator

    cfg = EvalConfig(label="base", pools=[PoolHarness(pool="p", harness="h")], task_ids=["a"], model="m",
                     proxy_url="http://p", journal=tmp_path / "e" / "journal.jsonl",
                     results=tmp_path / "e" / "results.json", runner_token_file=tmp_path / "runner-token")
    assert ev.reuse_results(cfg) is None
    coordinator = EvalCoordinator(cfg)
    (lease,) = coordinator.lease(LeaseRequest(runner_id="r", pool="p", harness="h"), 0.0)
    commit(coordinator, coordinator.journal, Completion(rollout_id=lease.rollout_id, lease_id=lease.lease_id, outcome=OutcomeKind.solved), [])
    coordinator.close()
    reused = ev.reuse_results(cfg)
    assert reused is not None and reused.pools[0].pass_at_1 == 1.0
    # More attempts is a different evaluation: the old journal and results are dropped.
    assert ev.reuse_results(cfg.model_copy(update={"attempts": 2})) is None
    assert not cfg.journal.exists() and not cfg.results.exists()


def test_adapter_names_are_safe_model_names() -> None:
    assert ev.adapter_name("tiny", "step-0000020") == "tiny-eval-step-0000020"
    assert ev.adapter_name("tiny", "my run/1") == "tiny-eval-my-run-1"
