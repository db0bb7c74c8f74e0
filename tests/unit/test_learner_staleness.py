"""Slow rollouts kept and corrected, not dropped: the coordinator (a pure state machine, time passed in) under
tasks of two lengths at the same difficulty.

Fast tasks finish in one tick, slow ones in six; the learner steps whenever a group is ready, so a slow rollout
is several policy versions old when it lands. Dropping rollouts past `max_staleness` 1 trains on fast tasks only;
keeping them (the default: the hard limit is a last resort, the loss corrects each token) trains on both, and each
step's batch says how many rollouts it trained and how many of them were stale, per harness."""

from __future__ import annotations

from harnessrl.runtime.contracts.coordinator import Completion, LeaseRequest, OutcomeKind
from harnessrl.runtime.contracts.learner_config import GrpoConfig, HarnessWeight, RewardConfig
from harnessrl.runtime.learner.coordinator import Batch, Coordinator
from harnessrl.runtime.learner.schedule import GroupPlanner
from harnessrl.runtime.trajectory.models import TrainingSequence

TICKS = {"fast": 1, "slow": 6}
TASKS = ["fast-0", "slow-0", "fast-1", "slow-1"]
STEPS = 24


def simulate(grpo: GrpoConfig) -> list[Batch]:
    """Each tick: rollouts due land, their tokens tagged with the policy version they were leased under; the
    learner takes one group if one is ready (a step: version + 1); runners lease every pending rollout. A fast
    rollout lands before the next step (on-policy), a slow one several steps later."""
    planner = GroupPlanner(TASKS, [HarnessWeight(pool="pa", harness="mini")], seed=0, shuffle=False)
    c = Coordinator(planner, grpo, RewardConfig(bonus=0.0), lease_ttl_s=1000, model="tiny", proxy_url="http://p")
    running: list[tuple[int, Completion, int]] = []  # (lands at, completion, version sampled at)
    batches: list[Batch] = []
    for now in range(200):
        for _, done, version in [r for r in running if r[0] == now]:
            seq = TrainingSequence(session_id=done.session_id, node_ids=[0], token_ids=[1, 2, 3],
                                   loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.7], policy_versions=[version] * 3)
            c.complete(done, [seq])
        running = [r for r in running if r[0] > now]
        batch = c.take_batch(grpo.groups_per_step)
        if batch is not None and batch.groups:
            batches.append(batch)
            c.finish_step(c.state.policy_version + 1, f"tiny-v{c.state.policy_version + 1}", done=False)
            if len(batches) == STEPS:
                break
        for le in c.lease(LeaseRequest(runner_id="r", pool="pa", harness="mini", max=1024), now=now):
            solved = int(le.rollout_id[-1]) % 2 == 0  # same difficulty: half of every group solves it
            done = Completion(rollout_id=le.rollout_id, lease_id=le.lease_id, session_id=le.rollout_id,
                              outcome=OutcomeKind.solved if solved else OutcomeKind.wrong,
                              correctness=1.0 if solved else 0.0)
            running.append((now + TICKS[le.task_id.split("-")[0]], done, le.policy_version))
    assert len(batches) == STEPS
    return batches


def trained_share(batches: list[Batch], kind: str) -> float:
    groups = [g for b in batches for g in b.groups]
    return sum(g.task_id.startswith(kind) for g in groups) / len(groups)


def test_dropping_stale_rollouts_trains_on_fast_tasks_and_keeping_them_trains_on_both() -> None:
    grpo = dict(group_size=4, groups_per_step=1, max_open_groups=4)
    dropped = simulate(GrpoConfig(**grpo, max_staleness=1))
    kept = simulate(GrpoConfig(**grpo))

    # Dropping: every slow rollout lands more than one version old, so the learner trains on fast tasks only,
    # and the step records say so: rollouts dropped per harness, none of the kept ones more than a version old.
    assert trained_share(dropped, "slow") == 0.0
    assert sum(b.stale_dropped_by_harness.get("mini", 0) for b in dropped) >= 4 * 4  # slow groups, whole
    # Keeping with correction: slow tasks are trained too, about as often as they are planned; nothing dropped.
    assert 0.3 <= trained_share(kept, "slow") <= 0.5
    assert all(b.stale_dropped_by_harness == {} and b.stale == 0 for b in kept)

    # Each step's record says what it trained and how much of that an older policy sampled (kept, corrected by
    # the loss), per harness: every slow rollout is among those, so their share is visible in the metrics.
    for b in kept:
        slow = sum(len(g.rollouts) for g in b.groups if g.task_id.startswith("slow"))
        assert b.rollouts_trained_by_harness == {"mini": sum(len(g.rollouts) for g in b.groups)}
        assert b.stale_kept_by_harness.get("mini", 0) >= slow
    kept_stale = sum(b.stale_kept_by_harness.get("mini", 0) for b in kept)
    trained = sum(b.rollouts_trained_by_harness["mini"] for b in kept)
    dropped_stale = sum(b.stale_kept_by_harness.get("mini", 0) for b in dropped)
    assert kept_stale / trained >= trained_share(kept, "slow") > 0.3 > dropped_stale / trained
