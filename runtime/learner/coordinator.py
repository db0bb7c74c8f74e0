"""The coordinator's state machine: groups, leases, completions, staleness. No I/O; time is passed in.

A group is one task × one harness (pool) × `group_size` rollout slots. Groups are planned in index order
(see schedule.py) and at most `open_groups` are alive at once, which bounds how far rollouts run ahead of
training. A slot follows the coordinator core's lease machine (runtime/coordinator/leases.py): pending → leased
→ done (scored) or, after an infrastructure failure, pending again until it has failed `max_attempts` times,
then abandoned; an expired lease makes it pending again at no cost. The trainer takes groups whose slots are
all final.

The whole state is one pydantic model, so a checkpoint is `state.model_dump_json()`; completions accepted
since then are replayed from the journal (runtime/coordinator/journal.py), in their order, with `journal_seq`
telling which.

Evaluation rounds (evaluation.py) live in the same state: their leases go out first, their completions are
routed to the round's eval ledger (runtime/coordinator/ledger.py) by rollout id, and `close_eval` turns a
finished round into its record. The coordinator core's server (runtime/coordinator/server.py) serves it.
"""

from __future__ import annotations

from enum import StrEnum

from harnessrl.runtime.contracts.coordinator import (
    GRADER_FAILURES,
    AckStatus,
    Completion,
    CompletionAck,
    CoordinatorStatus,
    EvalRecord,
    EvalRegression,
    Lease,
    LeaseRequest,
    OutcomeKind,
    PoolRollouts,
)
from harnessrl.runtime.contracts.learner_config import EvalSchedule, GrpoConfig, RewardConfig
from harnessrl.runtime.coordinator import leases
from harnessrl.runtime.coordinator import ledger as L
from harnessrl.runtime.coordinator.leases import CoordinatorError, UnknownRollout
from harnessrl.runtime.learner import evaluation as E
from harnessrl.runtime.learner.reward import group_advantages, reward, scale_batch
from harnessrl.runtime.learner.schedule import GroupPlanner
from harnessrl.runtime.trajectory.models import TrainingSequence
from pydantic import BaseModel, Field


class SlotStatus(StrEnum):
    pending = "pending"
    leased = "leased"
    done = "done"  # scored
    abandoned = "abandoned"  # unscored max_attempts times


class RolloutSlot(leases.LeasedSlot):
    status: SlotStatus = SlotStatus.pending
    unscored: int = 0
    session_id: str | None = None
    outcome: str | None = None
    reward: float | None = None
    tool_calls: int = 0
    sequences: list[TrainingSequence] = Field(default_factory=list)


class GroupState(BaseModel):
    index: int
    group_id: str
    task_id: str
    pool: str
    harness: str
    slots: list[RolloutSlot]

    def final(self) -> bool:
        return all(s.status in (SlotStatus.done, SlotStatus.abandoned) for s in self.slots)


class Counters(BaseModel):
    rollouts_scored: int = 0
    rollouts_unscored: int = 0
    rollouts_stale: int = 0
    rollouts_abandoned: int = 0
    duplicates: int = 0
    leases: int = 0
    leases_expired: int = 0
    groups_trained: int = 0
    groups_zero_variance: int = 0
    groups_too_small: int = 0
    tokens_trained: int = 0
    pools: dict[str, PoolRollouts] = Field(default_factory=dict)  # `active` is filled in by status()


class TrainRollout(BaseModel):
    rollout_id: str
    reward: float
    advantage: float
    sequences: list[TrainingSequence]


class TrainGroup(BaseModel):
    group_id: str
    task_id: str
    harness: str
    rollouts: list[TrainRollout]


class Batch(BaseModel):
    """What one step trains on, plus what it consumed for the metrics."""

    groups: list[TrainGroup] = Field(default_factory=list)
    # every fresh scored rollout consumed since the last batch, trained or skipped
    rewards_by_harness: dict[str, list[float]] = Field(default_factory=dict)
    stale: int = 0  # dropped: older than grpo.max_staleness
    # Per harness: rollouts trained, and of them those sampled (in part) by an older policy than the one trained,
    # kept and corrected; and the rollouts dropped as stale.
    rollouts_trained_by_harness: dict[str, int] = Field(default_factory=dict)
    stale_kept_by_harness: dict[str, int] = Field(default_factory=dict)
    stale_dropped_by_harness: dict[str, int] = Field(default_factory=dict)
    zero_variance: int = 0
    skipped: int = 0  # groups consumed without training: zero variance, or fewer than 2 fresh rollouts


class CoordinatorState(BaseModel):
    step: int = 0
    policy_version: int = 0
    policy_model: str = ""  # name harnesses/engines use for the current policy (base or `<name>-v<N>`)
    next_group: int = 0
    journal_seq: int = 0  # completions applied (checkpoint + replay boundary)
    done: bool = False
    groups: list[GroupState] = Field(default_factory=list)
    counters: Counters = Field(default_factory=Counters)
    carry: Batch = Field(default_factory=lambda: Batch())  # skipped groups' stats, reported with the next batch
    mean_reward: float | None = None  # of the rollouts the last step consumed
    eval_round: E.EvalRound | None = None  # open while training waits for it
    last_eval: EvalRecord | None = None
    eval_regressions: list[EvalRegression] = Field(default_factory=list)  # as of the last round


class Artifacts(BaseModel):
    """What the learner last wrote, for the status (not checkpointed: the learner finds it again on start)."""

    latest_checkpoint: str | None = None
    hub_revision: str | None = None
    export_error: str | None = None


# How far past the planned groups a completion may point (groups planned after the last checkpoint of a
# crashed run); beyond it the rollout id is rejected rather than planning without bound.
_REPLAN_LIMIT = 64


def _add(counts: dict[str, int], key: str, n: int) -> None:
    if n:
        counts[key] = counts.get(key, 0) + n


def _group_id(index: int) -> str:
    return f"g{index:07d}"


def _rollout_id(index: int, slot: int) -> str:
    return f"{_group_id(index)}-r{slot:03d}"


def _parse_rollout_id(rollout_id: str) -> tuple[int, int]:
    try:
        g, r = rollout_id.split("-r")
        if not g.startswith("g"):
            raise ValueError
        return int(g[1:]), int(r)
    except ValueError:
        raise UnknownRollout(f"unknown rollout id {rollout_id!r}") from None


class Coordinator:
    def __init__(
        self,
        planner: GroupPlanner,
        grpo: GrpoConfig,
        reward_cfg: RewardConfig,
        lease_ttl_s: float,
        model: str,
        proxy_url: str,
        max_attempts: int = 3,
        state: CoordinatorState | None = None,
        evaluation: EvalSchedule | None = None,
        eval_task_ids: list[str] | None = None,
    ):
        if evaluation is not None and not eval_task_ids:
            raise CoordinatorError("evaluation needs at least one task id of the eval split")
        self.evaluation = evaluation
        self.eval_task_ids = eval_task_ids or []
        self.artifacts = Artifacts()
        self.planner = planner
        self.grpo = grpo
        self.reward_cfg = reward_cfg
        self.lease_ttl_s = lease_ttl_s
        self.proxy_url = proxy_url
        self.max_attempts = max_attempts
        self.state = state or CoordinatorState(policy_model=model)
        if state is None and evaluation is not None and evaluation.at_start:
            # The base policy's round, before the first step: the baseline each later round is read against.
            self.state.eval_round = E.open_round(evaluation, self.eval_task_ids, 0, 0, model)

    # -- what the coordinator server asks (runtime/coordinator/service.py) -----------------------------------

    @property
    def done(self) -> bool:
        return self.state.done

    @property
    def journal_seq(self) -> int:
        return self.state.journal_seq

    def count_duplicate(self) -> None:
        self.state.counters.duplicates += 1

    def trains_on(self, rollout_id: str) -> bool:
        return not E.is_eval_rollout(rollout_id)

    def committed(self) -> None:
        """Nothing to do: the learner's loop takes what completions made ready."""

    # -- planning -------------------------------------------------------------------------------------------

    def _materialize(self, index: int) -> GroupState:
        task_id, hw = self.planner.plan(index)
        return GroupState(
            index=index,
            group_id=_group_id(index),
            task_id=task_id,
            pool=hw.pool,
            harness=hw.harness,
            slots=[RolloutSlot(rollout_id=_rollout_id(index, i)) for i in range(self.grpo.group_size)],
        )

    def _refill(self) -> None:
        while not self.state.done and len(self.state.groups) < self.grpo.open_groups():
            self.state.groups.append(self._materialize(self.state.next_group))
            self.state.next_group += 1

    def _group(self, index: int) -> GroupState | None:
        for g in self.state.groups:
            if g.index == index:
                return g
        return None

    def harness_of(self, rollout_id: str) -> str:
        """The harness a live rollout's group (or eval slot) runs ("" once it is gone)."""
        if E.is_eval_rollout(rollout_id):
            slot = self._eval_slot(rollout_id)
            return slot.harness if slot is not None else ""
        found = self._slot(rollout_id)
        return found[0].harness if found is not None else ""

    def _slot(self, rollout_id: str) -> tuple[GroupState, RolloutSlot] | None:
        index, slot = _parse_rollout_id(rollout_id)
        if slot >= self.grpo.group_size:
            raise UnknownRollout(f"unknown rollout id {rollout_id!r}")
        group = self._group(index)
        if group is None:
            if index < self.state.next_group:
                return None  # already trained on (or skipped): any completion now is a duplicate
            # Planned by a run that crashed before its checkpoint: planning is a pure function of the index.
            if index >= self.state.next_group + _REPLAN_LIMIT * self.grpo.open_groups():
                raise UnknownRollout(f"unknown rollout id {rollout_id!r}")
            while self.state.next_group <= index:
                self.state.groups.append(self._materialize(self.state.next_group))
                self.state.next_group += 1
            group = self._group(index)
            assert group is not None
        return group, group.slots[slot]

    # -- leases ---------------------------------------------------------------------------------------------

    def expire(self, now: float) -> int:
        n = len(leases.expire((s for g in self.state.groups for s in g.slots), now))
        self.state.counters.leases_expired += n
        return n

    def lease(self, req: LeaseRequest, now: float) -> list[Lease]:
        self.expire(now)
        self._refill()
        out = self._eval_leases(req, now)
        for g in self.state.groups:
            if g.pool != req.pool:
                continue
            if g.harness != req.harness:
                raise CoordinatorError(
                    f"pool {req.pool!r} runs harness {g.harness!r} in this run, runner says {req.harness!r}"
                )
            for s in g.slots:
                if len(out) >= req.max:
                    return out
                if s.status != SlotStatus.pending:
                    continue
                leases.grant(s, req.runner_id, now, self.lease_ttl_s)
                assert s.lease_id is not None and s.lease_deadline is not None
                self.state.counters.leases += 1
                out.append(
                    Lease(
                        rollout_id=s.rollout_id,
                        lease_id=s.lease_id,
                        task_id=g.task_id,
                        harness=g.harness,
                        pool=g.pool,
                        group_id=g.group_id,
                        policy_version=self.state.policy_version,
                        model=self.state.policy_model,
                        proxy_url=self.proxy_url,
                        lease_deadline=s.lease_deadline,
                    )
                )
        return out

    def renew(self, lease_ids: list[str], now: float) -> list[str]:
        """Keep the leases a live runner still works on (training and evaluation alike) from expiring."""
        wanted, deadline = set(lease_ids), now + self.lease_ttl_s
        renewed = leases.renew((s for g in self.state.groups for s in g.slots), wanted, deadline)
        if self.state.eval_round is not None:
            renewed += leases.renew(self.state.eval_round.ledger.slots.values(), wanted, deadline)
        return renewed

    def release(self, runner_id: str, pool: str) -> int:
        """A restarted runner's predecessor is gone: its leases for `pool` go out again on the next lease call."""
        n = leases.release((s for g in self.state.groups if g.pool == pool for s in g.slots), runner_id)
        if self.state.eval_round is not None:
            n += leases.release((s for s in self.state.eval_round.ledger.slots.values() if s.pool == pool), runner_id)
        return n

    # -- completions ----------------------------------------------------------------------------------------

    def check(self, c: Completion) -> CompletionAck | None:
        """The ack for a completion that changes nothing (duplicate), or None when it must be applied.

        Lets the server skip fetching sequences for duplicates; `complete` checks again, atomically."""
        if E.is_eval_rollout(c.rollout_id):
            return self._eval_check(c)
        found = self._slot(c.rollout_id)
        if not leases.is_lease_of(c.rollout_id, c.lease_id):
            raise CoordinatorError(f"lease {c.lease_id!r} is not a lease of rollout {c.rollout_id!r}")
        if found is None:
            return CompletionAck(rollout_id=c.rollout_id, status=AckStatus.duplicate, scored=False)
        _, s = found
        if s.status in (SlotStatus.done, SlotStatus.abandoned) or leases.repeated(s, c.lease_id):
            return CompletionAck(
                rollout_id=c.rollout_id, status=AckStatus.duplicate, scored=s.reward is not None, reward=s.reward
            )
        return None

    def complete(self, c: Completion, sequences: list[TrainingSequence]) -> CompletionAck:
        dup = self.check(c)
        if dup is not None:
            self.state.counters.duplicates += 1
            return dup
        self.state.journal_seq += 1
        if E.is_eval_rollout(c.rollout_id):
            rnd = self.state.eval_round
            assert rnd is not None
            self._count(rnd.ledger.slots[c.rollout_id].pool, c)
            return L.complete(rnd.ledger, c, self._max_unscored())
        found = self._slot(c.rollout_id)
        assert found is not None
        g, s = found
        self._count(g.pool, c)
        free = leases.finish(s, c.lease_id)
        r = reward(c.outcome, c.correctness, c.tool_calls, self.reward_cfg,
                   mismatches=c.unknown_tool_calls + c.invalid_tool_calls)
        if r is None:
            self.state.counters.rollouts_unscored += 1
            s.unscored += 1
            if free:  # else the live lease's holder decides (its completion, or its expiry)
                if s.unscored >= self.max_attempts:
                    leases.settle(s, SlotStatus.abandoned)
                    self.state.counters.rollouts_abandoned += 1
                else:
                    leases.settle(s, SlotStatus.pending)
            return CompletionAck(rollout_id=c.rollout_id, status=AckStatus.accepted, scored=False)
        self.state.counters.rollouts_scored += 1
        leases.settle(s, SlotStatus.done)
        s.session_id, s.outcome, s.reward, s.tool_calls = c.session_id, c.outcome.value, r, c.tool_calls
        s.sequences = sequences
        captured = self.state.counters.pools[g.pool]  # made by _count
        captured.captured_rollouts += 1
        captured.sequences += len(sequences)
        captured.sampled_tokens += sum(q.num_sampled for q in sequences)
        return CompletionAck(rollout_id=c.rollout_id, status=AckStatus.accepted, scored=True, reward=r)

    def _count(self, pool: str, c: Completion) -> None:
        counts = self.state.counters.pools.setdefault(pool, PoolRollouts())
        if c.outcome in (OutcomeKind.solved, OutcomeKind.wrong):
            counts.completed += 1
        elif c.outcome == OutcomeKind.timeout:
            counts.timed_out += 1
        else:
            counts.failed += 1
            counts.grader_failures += c.outcome in GRADER_FAILURES
        if c.timings is not None:
            counts.sandbox_seconds += c.timings.seconds
        counts.unknown_tool_calls += c.unknown_tool_calls
        counts.invalid_tool_calls += c.invalid_tool_calls
        for cause, n in c.prefix_breaks.items():
            counts.prefix_breaks[cause] = counts.prefix_breaks.get(cause, 0) + n

    # -- training -------------------------------------------------------------------------------------------

    def ready_groups(self) -> int:
        return sum(1 for g in self.state.groups if g.final())

    def take_batch(self, n: int) -> Batch | None:
        """The n oldest trainable final groups, or None if there are not enough yet. Once the groups skipped since
        the last batch and the trainable ones reach `grpo.groups_per_step_limit()`, the trainable ones there are
        (maybe none: a step without an update) make the batch: dynamic sampling is bounded.

        Stale rollouts are kept (the loss corrects them token by token) and counted per harness; only those past the
        hard limit (oldest sampled token more than max_staleness versions old) are dropped and counted.
        Final groups left with < 2 rollouts or no reward variance are consumed at once (so they never clog
        the window of open groups), counted, and reported with the next batch."""
        trainable: list[tuple[GroupState, list[float], list[RolloutSlot]]] = []
        skipped: set[int] = set()
        for g in self.state.groups:
            if not g.final():
                continue
            advantages, fresh, stale = self._fresh_advantages(g)
            if advantages is not None:
                trainable.append((g, advantages, fresh))
                continue
            skipped.add(g.index)
            self._consume(g, fresh, stale)
            self.state.carry.skipped += 1
            if len(fresh) < 2:
                self.state.counters.groups_too_small += 1
            else:
                self.state.counters.groups_zero_variance += 1
                self.state.carry.zero_variance += 1
        self.state.groups = [g for g in self.state.groups if g.index not in skipped]
        if len(trainable) < n and len(trainable) + self.state.carry.skipped < self.grpo.groups_per_step_limit():
            return None
        batch = self.state.carry
        chosen = trainable[:n]
        scaled = scale_batch([adv for _, adv, _ in chosen], [[s.reward or 0.0 for s in fresh] for _, _, fresh in chosen],
                             self.grpo.adv_epsilon, self.grpo.scale_rewards)
        for (g, _, fresh), advantages in zip(chosen, scaled, strict=True):
            self._consume(g, fresh, self._fresh_advantages(g)[2])
            self.state.counters.groups_trained += 1
            _add(batch.rollouts_trained_by_harness, g.harness, len(fresh))
            _add(batch.stale_kept_by_harness, g.harness,
                 sum(1 for s in fresh if any(q.min_policy_version < self.state.policy_version for q in s.sequences)))
            batch.groups.append(
                TrainGroup(
                    group_id=g.group_id,
                    task_id=g.task_id,
                    harness=g.harness,
                    rollouts=[
                        TrainRollout(rollout_id=s.rollout_id, reward=s.reward or 0.0, advantage=a, sequences=s.sequences)
                        for s, a in zip(fresh, advantages, strict=True)
                    ],
                )
            )
        taken = {g.index for g, _, _ in trainable[:n]}
        self.state.groups = [g for g in self.state.groups if g.index not in taken]
        self.state.carry = Batch()
        return batch

    def _consume(self, g: GroupState, fresh: list[RolloutSlot], stale: int) -> None:
        self.state.counters.rollouts_stale += stale
        self.state.carry.stale += stale
        _add(self.state.carry.stale_dropped_by_harness, g.harness, stale)
        self.state.carry.rewards_by_harness.setdefault(g.harness, []).extend(
            s.reward for s in fresh if s.reward is not None
        )

    def _fresh_advantages(self, g: GroupState) -> tuple[list[float] | None, list[RolloutSlot], int]:
        oldest_ok = self.state.policy_version - self.grpo.max_staleness
        done = [s for s in g.slots if s.status == SlotStatus.done]
        fresh = [s for s in done if all(q.min_policy_version >= oldest_ok for q in s.sequences)]
        stale = len(done) - len(fresh)
        rewards = [s.reward for s in fresh if s.reward is not None]
        return (group_advantages(rewards, self.grpo.adv_epsilon, self.grpo.scale_rewards, self.grpo.baseline),
                fresh, stale)

    def finish_step(self, policy_version: int, policy_model: str, done: bool) -> None:
        """Count the step; open an evaluation round when one is due (the run is done only after it)."""
        st = self.state
        st.step += 1
        st.policy_version = policy_version
        st.policy_model = policy_model
        if self.evaluation is not None and E.due(self.evaluation, st.step, self.grpo.steps):
            st.eval_round = E.open_round(self.evaluation, self.eval_task_ids, st.step, policy_version, policy_model)
        st.done = done and st.eval_round is None

    # -- evaluation -----------------------------------------------------------------------------------------

    def _eval_leases(self, req: LeaseRequest, now: float) -> list[Lease]:
        r = self.state.eval_round
        if r is None or req.pool not in E.pools_of(r):
            return []
        return L.lease(r.ledger, req, now, self.lease_ttl_s, r.model, self.proxy_url, r.policy_version,
                       self._max_unscored())

    def _eval_slot(self, rollout_id: str) -> L.Slot | None:
        r = self.state.eval_round
        if r is None or not rollout_id.startswith(r.prefix):
            return None
        return r.ledger.slots.get(rollout_id)

    def _eval_check(self, c: Completion) -> CompletionAck | None:
        r = self.state.eval_round
        if r is None or not c.rollout_id.startswith(r.prefix):
            # A round that has closed (or was lost in a restart): nothing left to count it in.
            return CompletionAck(rollout_id=c.rollout_id, status=AckStatus.duplicate, scored=False)
        return L.duplicate_ack(r.ledger, c)

    def _max_unscored(self) -> int:
        return self.evaluation.max_unscored if self.evaluation is not None else 1

    def close_eval(self, now: float) -> EvalRecord | None:
        """The open round's record once every rollout of it is final (then training goes on), else None."""
        r = self.state.eval_round
        if r is None:
            return None
        L.expire(r.ledger, now, self._max_unscored())  # a runner that died must not hold the round forever
        if not L.done(r.ledger):
            return None
        rec = E.record(r, now)
        self.state.eval_round, self.state.last_eval = None, rec
        self.state.done = self.state.step >= self.grpo.steps
        return rec

    # -- status ---------------------------------------------------------------------------------------------

    def status(self) -> CoordinatorStatus:
        c = self.state.counters
        return CoordinatorStatus(
            step=self.state.step,
            policy_version=self.state.policy_version,
            open_groups=len(self.state.groups),
            ready_groups=self.ready_groups(),
            leased=sum(1 for g in self.state.groups for s in g.slots if s.status == SlotStatus.leased),
            rollouts_scored=c.rollouts_scored,
            rollouts_unscored=c.rollouts_unscored,
            rollouts_stale=c.rollouts_stale,
            groups_skipped_zero_variance=c.groups_zero_variance,
            policy_model=self.state.policy_model,
            done=self.state.done,
            mean_reward=self.state.mean_reward,
            pass_at1=self.state.last_eval.pass_at1() if self.state.last_eval is not None else {},
            last_eval=self.state.last_eval,
            eval_regressions=self.state.eval_regressions,
            evaluating=E.progress(self.state.eval_round) if self.state.eval_round is not None else None,
            pools=self._pool_rollouts(),
            tokens_trained=c.tokens_trained,
            **self.artifacts.model_dump(),
        )

    def _pool_rollouts(self) -> dict[str, PoolRollouts]:
        active = [g.pool for g in self.state.groups for s in g.slots if s.status == SlotStatus.leased]
        if self.state.eval_round is not None:
            active += [s.pool for s in self.state.eval_round.ledger.slots.values() if s.status == L.SlotStatus.leased]
        pools = {p: c.model_copy() for p, c in self.state.counters.pools.items()}
        for pool in active:
            pools.setdefault(pool, PoolRollouts()).active += 1
        return pools
