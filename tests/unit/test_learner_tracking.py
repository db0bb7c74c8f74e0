"""Experiment tracking: TensorBoard event files as TensorBoard reads them, a tracker configured but not installed
failing the start with its reason, a tracker failing mid-run dropped with training going on."""

from __future__ import annotations

import json
import logging
import sqlite3
import struct
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from harnessrl.runtime.contracts.coordinator import EvalRecord, PoolScore
from harnessrl.runtime.contracts.learner_config import LearnerConfig
from harnessrl.runtime.contracts.learner_exit import (
    TRACKER_UNAVAILABLE,
    LearnerFailure,
    parse_termination_message,
)
from harnessrl.runtime.learner.coordinator import TrainGroup, TrainRollout
from harnessrl.runtime.learner.metrics import StepMetrics
from harnessrl.runtime.learner.samples import markdown, pick_samples
from harnessrl.runtime.learner.tracking import Tracking, missing
from harnessrl.runtime.trajectory.models import TrainingSequence
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.record_writer import masked_crc32c


def config(tmp_path: Path, **tracking: Any) -> LearnerConfig:
    return LearnerConfig.model_validate({
        "run_name": "vowels",
        "model": {"path": "/m", "served_name": "tiny"},
        "harnesses": [{"pool": "p", "harness": "mini-swe-agent"}],
        "tasks": {"ids": ["a"]},
        "proxy": {"url": "http://proxy", "admin_token_file": "/t"},
        "engine": {"urls": ["http://e:8000"]},
        "checkpoint": {"dir": str(tmp_path / "checkpoints")},
        "runner_token_file": "/r",
        "tracking": tracking,
    })


def step(n: int, loss: float) -> StepMetrics:
    return StepMetrics(
        step=n, policy_version=n, time=0.0, rollouts_scored=8 * n, rollouts_unscored=0, rollouts_stale=0,
        groups_trained=n, groups_zero_variance=0, mean_reward=0.5, mean_reward_by_harness={"mini-swe-agent": 0.25 * n},
        loss=loss, clip_fraction=0.0, kl=0.01, tokens=100, loss_tokens=40, tokens_per_s=10.0, step_s=1.0, sync_s=0.1,
        grad_norm=1.0,
    )


def eval_round(n: int, pass_at_1: float) -> EvalRecord:
    score = PoolScore(pool="p", harness="mini-swe-agent", rollouts=4, scored=4, solved=int(4 * pass_at_1),
                      unscored=0, pending=0, pass_at_1=pass_at_1, mean_correctness=pass_at_1)
    return EvalRecord(step=n, policy_version=n, model="tiny", time=0.0, tasks=4, attempts=1, pools=[score])


def read_events(logdir: Path) -> list[Event]:
    """Every record of every event file, its CRCs checked: TFRecord framing, as TensorBoard reads it."""
    events = []
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            header = data[at:at + 8]
            (length,) = struct.unpack("<Q", header)
            body = data[at + 12:at + 12 + length]
            assert struct.unpack("<I", data[at + 8:at + 12])[0] == masked_crc32c(header)
            assert struct.unpack("<I", data[at + 12 + length:at + 16 + length])[0] == masked_crc32c(body)
            events.append(Event.FromString(body))
            at += 16 + length
    return events


def scalars(events: list[Event]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for event in events:
        for value in event.summary.value:
            out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def test_each_step_and_eval_round_lands_in_tensorboard_event_files(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert cfg.tracking.report_to == ["tensorboard"]  # the default
    tracking = Tracking.open(cfg)
    tracking.start(first_step=1)
    tracking.log_eval(eval_round(0, 0.25))
    tracking.log_step(step(1, 0.5))
    tracking.log_step(step(2, -0.125))
    tracking.log_eval(eval_round(2, 0.75))
    tracking.close()

    logdir = tmp_path / "checkpoints" / "tracking" / "tensorboard"
    assert cfg.tracking_dir() / "tensorboard" == logdir
    got = scalars(read_events(logdir))
    assert got["train/loss"] == [(1, 0.5), (2, -0.125)]
    assert got["train/mean_reward_by_harness/mini-swe-agent"] == [(1, 0.25), (2, 0.5)]
    assert got["train/rollouts_scored"] == [(1, 8.0), (2, 16.0)]
    assert got["eval/pass_at_1/p"] == [(0, 0.25), (2, 0.75)]
    assert "train/step" not in got and "train/time" not in got


def test_a_resumed_learner_hides_the_steps_it_takes_again(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    first = Tracking.open(cfg)
    first.start(first_step=1)
    for n in (1, 2, 3):
        first.log_step(step(n, float(n)))
    first.close()
    # Resumed from the checkpoint of step 2: TensorBoard drops what the earlier process logged from step 3 on.
    second = Tracking.open(cfg)
    second.start(first_step=3)
    second.log_step(step(3, 30.0))
    second.close()
    events = read_events(cfg.tracking_dir() / "tensorboard")
    starts = [e.step for e in events if e.HasField("session_log") and e.session_log.status == SessionLog.START]
    assert starts[-1] == 3
    assert scalars(events)["train/loss"][-1] == (3, 30.0)


def test_a_tracker_configured_but_not_installed_fails_the_start_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError, as when not installed
    key = tmp_path / "wandb-key"
    key.write_text("k" * 40)
    cfg = config(tmp_path, report_to=["tensorboard", "wandb"], wandb={"api_key_file": str(key)})
    assert missing(cfg.tracking.report_to) == ["wandb"]
    with pytest.raises(LearnerFailure) as caught:
        Tracking.open(cfg)
    assert caught.value.reason == TRACKER_UNAVAILABLE
    assert "tracking.report_to lists wandb" in caught.value.message and "pip install wandb" in caught.value.message
    # The termination log carries it to the TrainingRun's Failed condition, as the operator reads it.
    assert parse_termination_message(str(caught.value)) == (TRACKER_UNAVAILABLE, caught.value.message)


class FakeWandbRun:
    def __init__(self, fail_on_step: int | None, key: str) -> None:
        self.logged: list[tuple[dict[str, float], int]] = []
        self.fail_on_step, self.key = fail_on_step, key

    def log(self, data: dict[str, float], step: int) -> None:
        if step == self.fail_on_step:
            raise RuntimeError(f"upload refused for key {self.key}")
        self.logged.append((data, step))

    def finish(self) -> None:
        pass


def fake_wandb(monkeypatch: pytest.MonkeyPatch, fail_on_step: int | None, key: str) -> list[dict[str, Any]]:
    """A `wandb` module that records its init calls; its runs fail to log `fail_on_step`."""
    inits: list[dict[str, Any]] = []
    module = types.ModuleType("wandb")

    def init(**kwargs: Any) -> FakeWandbRun:
        inits.append(kwargs | {"run": FakeWandbRun(fail_on_step, key)})
        return inits[-1]["run"]

    module.init = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.setenv("WANDB_API_KEY", "")  # restored (unset) after the test: Tracking sets it
    return inits


def test_an_empty_credential_fails_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_wandb(monkeypatch, None, "")
    key = tmp_path / "wandb-key"
    key.write_text("\n")
    with pytest.raises(LearnerFailure, match=r"tracking\.wandb\.api_key_file .* is empty") as caught:
        Tracking.open(config(tmp_path, report_to=["wandb"], wandb={"api_key_file": str(key)}))
    assert caught.value.reason == TRACKER_UNAVAILABLE


def test_a_tracker_that_fails_is_logged_once_without_its_key_and_dropped_while_the_others_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "wandb-secret-key-0123456789"
    inits = fake_wandb(monkeypatch, fail_on_step=2, key=secret)
    key = tmp_path / "wandb-key"
    key.write_text(secret + "\n")
    cfg = config(tmp_path, report_to=["tensorboard", "wandb"], project="harnessrl-test",
                 wandb={"api_key_file": str(key), "entity": "team"})
    tracking = Tracking.open(cfg)
    tracking.start(first_step=1)
    with caplog.at_level(logging.WARNING, logger="harnessrl.runtime.learner.tracking"):
        for n in (1, 2, 3):
            tracking.log_step(step(n, float(n)))
        tracking.close()

    [init] = inits
    assert (init["project"], init["entity"], init["name"], init["resume"]) == ("harnessrl-test", "team", "vowels", "allow")
    assert init["config"]["grpo.lr"] == cfg.grpo.lr and init["dir"] == str(cfg.tracking_dir())
    assert [s for _, s in init["run"].logged] == [1]  # dropped at step 2
    assert scalars(read_events(cfg.tracking_dir() / "tensorboard"))["train/loss"] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    # Other tests may leave the logger at INFO (its start line is captured then): only warnings count here.
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "tracker wandb failed (log)" in warning.getMessage()
    assert secret not in warning.getMessage() and "***" in warning.getMessage()
    assert list(tracking.backends) == ["tensorboard"]

    # A restarted learner goes on with the same W&B run.
    again = Tracking.open(cfg)
    again.start(first_step=3)
    again.close()
    assert inits[1]["id"] == inits[0]["id"]


def train_groups() -> list[TrainGroup]:
    def rollout(rid: str, reward: float, sequences: int) -> TrainRollout:
        seq = TrainingSequence(session_id=rid, node_ids=[0], token_ids=[1, 2, 3], loss_mask=[0, 1, 1],
                               logprobs=[0.0, -0.5, -0.25], policy_versions=[0, 0, 0])
        return TrainRollout(rollout_id=rid, reward=reward, advantage=reward - 0.5, sequences=[seq] * sequences)

    # Rewards and advantages exact in binary: MLflow writes its table's floats to 10 digits.
    return [TrainGroup(group_id="g1", task_id="add", harness="codex", rollouts=[
                rollout("g1-r0", 0.0, 1), rollout("g1-r1", 1.25, 2), rollout("g1-r2", 0.0, 1)]),
            TrainGroup(group_id="g2", task_id="sort|desc", harness="codex", rollouts=[
                rollout("g2-r0", 1.0, 1), rollout("g2-r1", 0.5, 1)]),
            TrainGroup(group_id="g3", task_id="add", harness="claude-code", rollouts=[rollout("g3-r0", 1.0, 3)])]


def test_each_harness_samples_its_best_its_worst_and_one_at_random() -> None:
    samples = pick_samples(train_groups(), 7, "http://127.0.0.1:8765/")
    picks = [(s.harness, s.pick, s.rollout_id) for s in samples]
    # claude-code's one rollout is its best and its worst; codex's worst is the last of its equal lowest.
    assert picks[:3] == [("claude-code", "best", "g3-r0"), ("codex", "best", "g1-r1"), ("codex", "worst", "g1-r2")]
    assert picks[3][:2] == ("codex", "random") and picks[3][2] in {"g1-r0", "g2-r0", "g2-r1"} and len(picks) == 4
    best = samples[1]
    assert (best.task_id, best.reward, best.advantage, best.sequences, best.sampled_tokens, best.link) == (
        "add", 1.25, 0.75, 2, 4, "http://127.0.0.1:8765/rollouts/g1-r1")
    # The draw is the step's: a step taken again after a resume logs the same rollouts.
    assert {pick_samples(train_groups(), 7, None)[3].rollout_id for _ in range(5)} == {picks[3][2]}
    assert pick_samples(train_groups(), 7, None)[0].link == "/rollouts/g3-r0"
    assert len({pick_samples(train_groups(), n, None)[3].rollout_id for n in range(40)}) == 3


def test_rollout_samples_land_in_each_trackers_own_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """All four trackers, each real and offline: W&B in offline mode, MLflow's file store, trackio's local
    database, TensorBoard's event files. Each table is read back from the tracker's own files."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_API_KEY", "")  # restored (unset) after the test: Tracking sets it
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store for those who ask
    monkeypatch.setenv("TRACKIO_DIR", "")
    # trackio reads TRACKIO_DIR once, at import (as the learner's one process does): an import by an earlier test
    # of this session would keep its directory, so this test imports it afresh (restored after).
    for name in [m for m in sys.modules if m == "trackio" or m.startswith("trackio.")]:
        monkeypatch.delitem(sys.modules, name)
    (tmp_path / "wandb-key").write_text("k" * 40)
    (tmp_path / "mlflow-uri").write_text(f"file://{tmp_path / 'mlruns'}")
    cfg = config(tmp_path, report_to=["tensorboard", "wandb", "mlflow", "trackio"],
                 wandb={"api_key_file": str(tmp_path / "wandb-key")},
                 mlflow={"tracking_uri_file": str(tmp_path / "mlflow-uri")}, viewer_url="http://127.0.0.1:8765")
    samples = pick_samples(train_groups(), 1, cfg.tracking.viewer_url)
    tracking = Tracking.open(cfg)
    tracking.start(first_step=1)
    tracking.log_step(step(1, 0.5))
    tracking.log_samples(samples, 1)
    tracking.close(timeout_s=120)
    assert set(tracking.backends) == {"tensorboard", "wandb", "mlflow", "trackio"}  # none failed
    rows = [[s.step, s.harness, s.pick, s.rollout_id, s.task_id, s.reward, s.advantage, s.sequences,
             s.sampled_tokens, s.link] for s in samples]
    columns = ["step", "harness", "pick", "rollout_id", "task_id", "reward", "advantage", "sequences",
               "sampled_tokens", "link"]
    tracking_dir = cfg.tracking_dir()

    [text] = [(e.step, v) for e in read_events(tracking_dir / "tensorboard") for v in e.summary.value
              if v.metadata.plugin_data.plugin_name == "text"]
    assert text[0] == 1 and text[1].tag.startswith("rollouts/samples")
    table = text[1].tensor.string_val[0].decode().splitlines()
    assert table[0] == "| " + " | ".join(columns[:-1]) + " |" and len(table) == 2 + len(samples)
    assert table[4] == ("| 1 | codex | worst | [g1-r2](http://127.0.0.1:8765/rollouts/g1-r2) | add | 0.0000 | -0.5000 "
                        "| 1 | 2 |")
    assert r"| sort\|desc |" in markdown([samples[0].model_copy(update={"task_id": "sort|desc"})])  # escaped

    [wandb_table] = (tracking_dir / "wandb").glob("offline-run-*/files/media/table/rollouts/samples_*.table.json")
    assert json.loads(wandb_table.read_text()) == {"columns": columns, "data": rows}

    [mlflow_table] = (tmp_path / "mlruns").glob("*/*/artifacts/rollouts/samples/step-000001.json")
    assert json.loads(mlflow_table.read_text()) == {"columns": columns, "data": rows}

    with sqlite3.connect(tracking_dir / "trackio" / "harnessrl.db") as db:
        logged = [json.loads(m) for (m,) in db.execute("SELECT metrics FROM metrics WHERE step = 1")]
    [trackio_table] = [m["rollouts/samples"] for m in logged if "rollouts/samples" in m]
    assert trackio_table["_type"] == "trackio.table"
    assert trackio_table["_value"] == [dict(zip(columns, row, strict=True)) for row in rows]
