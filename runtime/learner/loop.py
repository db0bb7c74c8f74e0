"""The learner process: restore, serve the coordinator, and step → sync → checkpoint → export until done.

Training and weight I/O run in a worker thread; everything that touches the coordinator runs on the event
loop, so a checkpoint's snapshot of the coordinator is consistent with the journal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx
import torch
from harnessrl.runtime.contracts.coordinator import read_runner_token
from harnessrl.runtime.contracts.learner_config import LearnerConfig, SyncMode
from harnessrl.runtime.contracts.learner_exit import (
    WEIGHT_SYNC_FAILED,
    WEIGHT_SYNC_UNSUPPORTED,
    LearnerFailure,
)
from harnessrl.runtime.contracts.proxy import PolicyState
from harnessrl.runtime.coordinator.journal import Journal
from harnessrl.runtime.coordinator.server import create_app
from harnessrl.runtime.coordinator.service import replay
from harnessrl.runtime.engine.restart import sync_dir
from harnessrl.runtime.learner.background import LatestOnlyWorker
from harnessrl.runtime.learner.checkpoint import (
    latest_checkpoint,
    load_optimizer_state,
    read_checkpoint,
    restore_rng,
    take_snapshot,
    write_checkpoint,
)
from harnessrl.runtime.learner.coordinator import Artifacts, Batch, Coordinator, CoordinatorState
from harnessrl.runtime.learner.distributed import World
from harnessrl.runtime.learner.evaluation import EvalLog, read_records
from harnessrl.runtime.learner.hub import HubExporter
from harnessrl.runtime.learner.metrics import (
    MetricsSink,
    StepMetrics,
    captured_by_harness,
    mean,
    trained_by_harness,
)
from harnessrl.runtime.learner.packing import Sample, trainable
from harnessrl.runtime.learner.ranks import Lead
from harnessrl.runtime.learner.samples import pick_samples
from harnessrl.runtime.learner.schedule import GroupPlanner
from harnessrl.runtime.learner.sync import ProxyControl, make_sync, publish_policy
from harnessrl.runtime.learner.tracking import Tracking
from harnessrl.runtime.learner.trainer import PolicyTrainer, StepStats, compute_dtype, load_policy
from harnessrl.runtime.serving import server as http_server

log = logging.getLogger(__name__)
T = TypeVar("T")

# After the last step the coordinator keeps answering `done` this long, so runners hear it and exit.
DONE_GRACE_S = 3.0
# A component the learner pushes to (engine, proxy) may be restarting: keep trying this long before giving up.
PUBLISH_RETRY_S = 600.0
# How often the learner checks that every engine still serves the current policy (an engine restart loses it).
WATCH_ENGINES_S = 5.0


def solved_rates(batch_rewards: dict[str, list[float]]) -> dict[str, float]:
    """Training pass@1 per harness: share of consumed rollouts that were fully correct (reward >= 1)."""
    return {h: sum(1 for r in rs if r >= 1.0) / len(rs) for h, rs in batch_rewards.items() if rs}


def build_trainer(cfg: LearnerConfig, world: World) -> tuple[PolicyTrainer, Path | None]:
    """The policy and its optimizer, from the latest checkpoint when there is one; the same on every rank."""
    latest = latest_checkpoint(cfg.checkpoint.dir)
    adapter_dir = latest / "policy" if latest is not None and cfg.adapter.kind == "lora" else None
    model_cfg = cfg.model
    if latest is not None and cfg.adapter.kind == "full":
        model_cfg = cfg.model.model_copy(update={"path": latest / "policy"})
    # A new adapter's initial weights follow grpo.seed, so seeds are replicates; a checkpoint restores its own RNG.
    torch.manual_seed(cfg.grpo.seed)
    model = load_policy(model_cfg, cfg.adapter, adapter_dir, world, cfg.grpo.temperature)
    compute = compute_dtype(cfg.model, next(model.parameters()).device)
    trainer = PolicyTrainer(model, cfg.grpo, pad_id=_pad_id(cfg.model.path), compute=compute, world=world)
    if latest is not None:
        trainer.load_optimizer_state(load_optimizer_state(latest))
        restore_rng(latest)
    return trainer, latest


class Learner:
    """Rank 0's program (the only one in a world of one); the other ranks follow it (ranks.follow)."""

    def __init__(self, cfg: LearnerConfig, world: World = World()):
        self.cfg = cfg
        if world.distributed and cfg.engine.sync == SyncMode.nccl:
            raise LearnerFailure(WEIGHT_SYNC_UNSUPPORTED,
                                 "engine.sync nccl sends one process's whole weights: it needs a learner of one process")
        ck = cfg.checkpoint
        ck.dir.mkdir(parents=True, exist_ok=True)
        self.metrics = MetricsSink(cfg.metrics_file())
        self.evals = EvalLog(cfg.eval_file(), self.metrics.registry)
        # Before the model loads (minutes): a tracker configured but not installed fails the start at once.
        self.tracking = Tracking.open(cfg)
        trainer, latest = build_trainer(cfg, world)
        self.trainer = Lead(trainer, world)
        state: CoordinatorState | None = None
        if latest is not None:
            state = read_checkpoint(latest).state
            self.metrics.truncate_to(state.step)
            self.evals.truncate_to(state.step)
            log.info("resumed from %s at step %d (policy v%d)", latest.name, state.step, state.policy_version)
        self.tracking.start(first_step=(state.step if state is not None else 0) + 1)
        planner = GroupPlanner(cfg.tasks.load(), cfg.harnesses, cfg.grpo.seed, cfg.tasks.shuffle)
        self.coordinator = Coordinator(
            planner,
            cfg.grpo,
            cfg.reward,
            cfg.lease_ttl_s,
            cfg.model.served_name,
            cfg.proxy.url,
            max_attempts=cfg.rollout_max_attempts,
            state=state,
            evaluation=cfg.eval,
            eval_task_ids=cfg.eval.task_ids() if cfg.eval is not None else None,
        )
        self.coordinator.artifacts.latest_checkpoint = str(latest) if latest is not None else None
        self.journal = Journal(ck.dir / "journal.jsonl")
        replay(self.coordinator, self.journal, self.coordinator.state.journal_seq)
        self.sync = make_sync(cfg.engine, cfg.model, sync_dir(ck.dir))
        self.proxy = ProxyControl(cfg.proxy)
        self.exporter = (HubExporter(cfg.export, cfg.run_name, str(cfg.model.path), cfg.eval_file())
                         if cfg.export is not None else None)
        exporter, artifacts = self.exporter, self.coordinator.artifacts
        self.exports = (
            LatestOnlyWorker[tuple[Path, list[StepMetrics]]](
                lambda job: export_checkpoint(exporter, job[0], job[1], artifacts), "hub-export")
            if exporter is not None else None
        )
        self.checkpoints_written = 0
        self.writing: asyncio.Task[Path] | None = None  # the checkpoint being written while training goes on
        # The checkpoint due for export, until its step's evaluation round is recorded. A restart exports its
        # checkpoint again (unchanged files are not uploaded twice): an export the crash cut short, or one still
        # waiting for the round, is not lost.
        self.unexported: Path | None = latest if exporter is not None else None
        self.weights = asyncio.Lock()

    async def publish(self, version: int) -> tuple[PolicyState, float]:
        t0 = time.perf_counter()

        async def attempt() -> PolicyState:
            policy = await asyncio.to_thread(publish_policy, self.sync, self.trainer.published,
                                             self.cfg.model.served_name, version)
            await self.proxy.set_policy(policy)
            return policy

        policy = await with_retries(attempt, f"publishing policy v{version}", PUBLISH_RETRY_S)
        return policy, time.perf_counter() - t0

    async def retire(self) -> None:
        """The run is done: unload its policies, so an engine shared with other runs has room for theirs. Best
        effort: an engine already gone has nothing to unload, and the run's result stands either way."""
        try:
            async with self.weights:
                await asyncio.to_thread(self.sync.retire, self.coordinator.state.policy_version)
        except Exception as exc:
            log.warning("unloading this run's policies from the engines: %s", exc)

    async def watch_engines(self) -> None:
        """Serve the current policy again on engines that restarted without it (a LoRA load, or a rebuilt NCCL
        group and a push); a LearnerFailure here ends the process like one in training."""
        while True:
            await asyncio.sleep(WATCH_ENGINES_S)
            version = self.coordinator.state.policy_version
            if version == 0:
                continue
            try:
                async with self.weights:
                    restored = await asyncio.to_thread(self.sync.restore, version)
            except (httpx.HTTPError, OSError, RuntimeError) as exc:
                log.warning("checking the engines for policy v%d: %s", version, exc)
                continue
            if restored:
                log.info("policy v%d loaded again into restarted engine(s) %s", version, ", ".join(restored))

    async def train(self) -> None:
        st = self.coordinator.state
        # Engines may have restarted since the checkpoint: serve its policy again before handing out leases.
        policy, _ = await self.publish(st.policy_version)
        st.policy_model = policy.model
        while True:
            await self.evaluate()
            last = st.step >= self.cfg.grpo.steps
            if self.writing is not None and (self.writing.done() or last):
                await self.checkpoint_written()  # a failed write fails the run here, as it did inline
            self.export()
            if last:
                break
            batch = self.coordinator.take_batch(self.cfg.grpo.groups_per_step)
            if batch is None:
                await asyncio.sleep(0.05)
                continue
            await self.step(batch)
        if self.exports is not None:
            # The run is done only once its last checkpoint is on the Hub.
            await asyncio.to_thread(self.exports.drain)
        st.done = True

    async def evaluate(self) -> None:
        """Wait out the open evaluation round (if any): the next step must not change the policy it measures."""
        while self.coordinator.state.eval_round is not None:
            rec = self.coordinator.close_eval(time.time())
            if rec is None:
                await asyncio.sleep(0.1)
                continue
            self.coordinator.state.eval_regressions = self.evals.record(rec)
            self.tracking.log_eval(rec)
            scores = ", ".join(f"{p.pool} {p.solved}/{p.scored}" for p in rec.pools)
            log.info("eval at step %d (policy v%d): pass@1 %s (%s)", rec.step, rec.policy_version, rec.pass_at1(), scores)
            for regression in self.coordinator.state.eval_regressions:
                log.warning("collapse alarm: %s", regression.describe())

    async def step(self, batch: Batch) -> None:
        st = self.coordinator.state
        # Only sequences with a sampled token to score: a batch whose rollouts captured none (every turn of
        # every rollout failed upstream, say) would otherwise crash the step, and on restart the journal replays
        # it into the same batch, so the learner would crash-loop.
        samples = trainable([
            Sample(sequence=seq, advantage=r.advantage, rollout=r.rollout_id, harness=g.harness)
            for g in batch.groups
            for r in g.rollouts
            for seq in r.sequences
        ])
        if samples:
            # Held from the update to its publish: an engine restored meanwhile must not get half-updated weights.
            async with self.weights:
                stats = await asyncio.to_thread(self.trainer.step, samples)
                version = st.policy_version + 1
                policy, sync_s = await self.publish(version)
        else:
            # No group with reward variance (bounded dynamic sampling) or no trainable token: no update.
            stats, version, sync_s = StepStats.without_update(), st.policy_version, 0.0
            policy = PolicyState(model=st.policy_model, version=version)
        done = st.step + 1 >= self.cfg.grpo.steps
        all_rewards = [r for rs in batch.rewards_by_harness.values() for r in rs]
        st.mean_reward = mean(all_rewards)
        self.coordinator.finish_step(version, policy.model, done=done)
        c = st.counters
        c.tokens_trained += stats.tokens
        sequences_per_rollout, loss_tokens = captured_by_harness(batch.groups)
        tokens, repeated_prefix = trained_by_harness((s.harness, s.sequence) for s in samples)
        metrics = StepMetrics(
            step=st.step,
            policy_version=st.policy_version,
            time=time.time(),
            rollouts_scored=c.rollouts_scored,
            rollouts_unscored=c.rollouts_unscored,
            rollouts_stale=c.rollouts_stale,
            groups_trained=c.groups_trained,
            groups_zero_variance=c.groups_zero_variance,
            mean_reward=mean(all_rewards),
            mean_reward_by_harness={h: m for h, rs in batch.rewards_by_harness.items() if (m := mean(rs)) is not None},
            solved_rate_by_harness=solved_rates(batch.rewards_by_harness),
            sequences_per_rollout_by_harness=sequences_per_rollout,
            loss_tokens_by_harness=loss_tokens,
            tokens_by_harness=tokens,
            repeated_prefix_tokens_by_harness=repeated_prefix,
            rollouts_trained_by_harness=batch.rollouts_trained_by_harness,
            stale_rollouts_kept_by_harness=batch.stale_kept_by_harness,
            stale_rollouts_dropped_by_harness=batch.stale_dropped_by_harness,
            is_truncated_tokens_by_harness=stats.is_truncated_by_harness,
            is_masked_tokens_by_harness=stats.is_masked_by_harness,
            loss=stats.loss,
            clip_fraction=stats.clip_fraction,
            kl=stats.kl,
            base_kl=stats.base_kl,
            tokens=stats.tokens,
            loss_tokens=stats.loss_tokens,
            tokens_per_s=stats.tokens_per_s,
            step_s=stats.seconds,
            sync_s=sync_s,
            grad_norm=stats.grad_norm,
        )
        self.metrics.record(metrics)
        self.tracking.log_step(metrics)
        self.tracking.log_samples(pick_samples(batch.groups, st.step, self.cfg.tracking.viewer_url), st.step)
        log.info(
            "step %d v%d loss %.4f reward %s clip %.3f kl %.4f %.0f tok/s sync %.2fs",
            st.step, version, stats.loss, mean(all_rewards), stats.clip_fraction, stats.kl, stats.tokens_per_s, sync_s,
        )
        if st.step % self.cfg.checkpoint.every == 0 or done:
            await self.checkpoint()

    async def checkpoint(self) -> None:
        """Snapshot the checkpoint and start writing it; the next step trains meanwhile. At most one write is in
        flight: on a volume slower than `checkpoint.every` steps, the step waits for the last write instead of
        holding another copy of the weights and optimizer state in memory."""
        if self.writing is not None:
            await self.checkpoint_written()
        # The coordinator's copy on the loop: no completion can land between it and the journal position it
        # records. The weights' and optimizer's copies off it (gathering is collective: every rank joins).
        state = self.coordinator.state.model_copy(deep=True)
        snapshot = await asyncio.to_thread(
            lambda: take_snapshot(state, self.trainer.policy_state(), self.trainer.optimizer_state(),
                                  self.metrics.path, read_records(self.evals.path)))
        ck = self.cfg.checkpoint
        # Pays: a step with a checkpoint 1.18x faster than with the write inline (benchmarks/checkpoint, 2 CPUs).
        self.writing = asyncio.create_task(asyncio.to_thread(
            write_checkpoint, ck.dir, self.trainer.model, snapshot, self.cfg.adapter.kind, ck.keep))

    async def checkpoint_written(self) -> Path:
        """Wait for the checkpoint being written, and hand it to the status and the Hub export."""
        assert self.writing is not None
        path = await self.writing
        self.writing = None
        self.checkpoints_written += 1
        self.coordinator.artifacts.latest_checkpoint = str(path)
        log.info("checkpoint %s", path.name)
        if self.exporter is not None and self.checkpoints_written % self.exporter.every == 0:
            self.unexported = path
        return path

    def export(self) -> None:
        """Hand the checkpoint due for export to the background upload, once its step's evaluation round (if any)
        is recorded: the model card and the choice of the checkpoint on main need its held-out pass@1."""
        if self.exports is not None and self.unexported is not None:
            # Off the step's critical path: the upload runs while training goes on (background.py).
            self.exports.submit((self.unexported, self.metrics.history()))
            self.unexported = None

    async def serve(self) -> None:
        async with httpx.AsyncClient(timeout=60.0) as client:
            app = create_app(self.coordinator, self.journal, read_runner_token(self.cfg.runner_token_file),
                             self.proxy.fetcher(client), self.metrics.registry)
            server = http_server(app, self.cfg.host, self.cfg.port, lifespan="off")
            serving = asyncio.create_task(server.serve())
            watching = asyncio.create_task(self.watch_engines())
            training = asyncio.create_task(self.train())
            try:
                # The watcher only ever ends by failing: then the run fails with its reason too.
                await asyncio.wait({training, watching}, return_when=asyncio.FIRST_COMPLETED)
                if watching.done():
                    training.cancel()
                    watching.result()
                training.result()
                await asyncio.sleep(DONE_GRACE_S)
                watching.cancel()  # it would serve the retired policy again
                await self.retire()
            finally:
                training.cancel()
                watching.cancel()
                server.should_exit = True
                await serving
                self.journal.close()
                self.tracking.close()
                self.trainer.stop()


async def with_retries(attempt: Callable[[], Awaitable[T]], what: str, window_s: float) -> T:
    """Retry `attempt` on errors a restarting engine or proxy causes, with backoff, for `window_s`; then the run
    fails with WeightSyncFailed (a process restart reaches a component that stayed down no better). A
    LearnerFailure (a refused request, a missing API) is not retried."""
    deadline, delay = time.monotonic() + window_s, 1.0
    while True:
        try:
            return await attempt()
        except (httpx.HTTPError, OSError, RuntimeError) as exc:
            if time.monotonic() + delay > deadline:
                raise LearnerFailure(WEIGHT_SYNC_FAILED, f"{what} kept failing for {window_s:.0f}s: {exc}") from exc
            log.warning("%s failed (%s); retrying in %.0fs", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 15.0)


def export_checkpoint(exporter: HubExporter, path: Path, history: list[StepMetrics], artifacts: Artifacts) -> None:
    """Export `path`; a failure is recorded for the status (HubExportFailing) and retried at the next export:
    the Hub being down must not stop training."""
    try:
        artifacts.hub_revision = exporter.export(path, history)
        artifacts.export_error = None
        log.info("exported %s to the Hub at revision %s", path.name, artifacts.hub_revision)
    except Exception as exc:  # any failure of the upload (HTTP, auth, a missing token) is the same to training
        artifacts.export_error = f"{type(exc).__name__}: {exc}"[:1024]
        log.warning("exporting %s to the Hub failed: %s", path.name, artifacts.export_error)


def _pad_id(model_path: Path) -> int:
    """Any valid id works (padded positions are masked out); prefer the tokenizer's own pad token."""
    import json

    for name in ("tokenizer_config.json", "config.json"):
        p = model_path / name
        if p.exists():
            data = json.loads(p.read_text())
            for key in ("pad_token_id", "eos_token_id"):
                if isinstance(data.get(key), int):
                    return int(data[key])
    return 0
