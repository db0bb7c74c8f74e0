"""Coordinator <-> runner HTTP wire models (the runner is the client, the learner serves).

Endpoints (all JSON, served by the learner process):
- ``POST /v1/leases``      LeaseRequest  -> LeaseResponse
- ``POST /v1/leases/renew`` LeaseRenewal -> LeaseRenewalResponse
- ``POST /v1/leases/release`` LeaseRelease -> LeaseReleaseResponse (a runner starting up)
- ``POST /v1/completions`` Completion    -> CompletionAck   (idempotent; 404 for an unknown rollout)
- ``GET  /v1/status``      -> CoordinatorStatus
- ``GET  /healthz``, ``GET /metrics`` (Prometheus text)

The four POST endpoints take the runner credential as ``Authorization: Bearer <token>`` (the run's runner token,
a file in the runner's and the coordinator's configs); without it, or with another, they answer 401
``{"detail": ...}``. Status, health and metrics are open and read-only: they carry counts and names, no secret,
and the operator (which reads status) needs no credential that could also lease or complete rollouts.

A runner leases up to ``max`` rollouts for the pool it serves; each lease names the task, the harness,
the GRPO group, the policy version at lease time and the proxy to create the session at. The runner
creates the session at the proxy (the session id is the harness's API key), runs the harness, grades,
and completes the rollout. While it works it renews its leases every ``renew_every_s``; a lease not renewed
by its ``lease_deadline`` (its runner died) is handed out again with a new ``lease_id``; whichever completion of a rollout arrives first is the one counted, later ones are acked
as duplicates, so a rollout is never counted twice.
"""

from __future__ import annotations

import math
from enum import StrEnum
from pathlib import Path

import httpx
from harnessrl.runtime.contracts.client import bearer, reply
from harnessrl.runtime.trajectory.models import BreakCause
from pydantic import BaseModel, ConfigDict, Field

LEASES_PATH = "/v1/leases"
RENEW_PATH = "/v1/leases/renew"
RELEASE_PATH = "/v1/leases/release"
COMPLETIONS_PATH = "/v1/completions"
STATUS_PATH = "/v1/status"


class PoolHarness(BaseModel):
    """A pool and the harness its runners run (a learner's and an evaluation's config name them)."""

    pool: str = Field(min_length=1, max_length=253)
    harness: str = Field(min_length=1, max_length=63)


class _Wire(BaseModel):
    # Unknown fields are an error: a typo on either side should fail loudly, not be dropped.
    model_config = ConfigDict(extra="forbid")


def read_runner_token(path: Path) -> str:
    """The run's runner credential from its file (a mounted Secret, or a file `harnessrl run` generated)."""
    token = Path(path).read_text().strip()
    if not token:
        raise ValueError(f"runner token file {path} is empty")
    return token


class OutcomeKind(StrEnum):
    """How a rollout ended. All but the last two are the candidate's doing and therefore scored (the rule is in
    runtime/harness/runner.py): a grader that timed out or wrote no reward on the candidate's work is the
    candidate's failure, unless the grader fails on the task's reference answer too."""

    solved = "solved"  # grader passed
    wrong = "wrong"  # grader ran and failed (or gave partial credit through `correctness`)
    harness_error = "harness_error"  # the harness gave up on the model's output (bad format, crash on it)
    timeout = "timeout"  # wall-clock or step budget spent by the agent
    grader_timeout = "grader_timeout"  # the grader ran past its limit on the candidate's work (an endless loop)
    grader_no_reward = "grader_no_reward"  # the grader wrote no usable reward on the candidate's work
    grader_error = "grader_error"  # the grader fails on the reference answer too: says nothing about the policy
    infra_error = "infra_error"  # sandbox, proxy, engine or network failure


SCORED_OUTCOMES: frozenset[OutcomeKind] = frozenset(
    {OutcomeKind.solved, OutcomeKind.wrong, OutcomeKind.harness_error, OutcomeKind.timeout,
     OutcomeKind.grader_timeout, OutcomeKind.grader_no_reward}
)
# The scored outcomes where the grader broke on the candidate's work (counted apart in status and metrics).
GRADER_FAILURES: frozenset[OutcomeKind] = frozenset({OutcomeKind.grader_timeout, OutcomeKind.grader_no_reward})


class LeaseRequest(_Wire):
    runner_id: str = Field(min_length=1, max_length=253)
    pool: str = Field(min_length=1, max_length=253, description="HarnessPool name the runner serves")
    harness: str = Field(min_length=1, max_length=63, description="harness the pool runs, e.g. 'claude-code'")
    max: int = Field(default=1, ge=1, le=1024, description="most rollouts to lease in this call")


class Lease(_Wire):
    rollout_id: str
    lease_id: str = Field(description="this attempt; a re-lease after expiry gets a new one")
    task_id: str
    harness: str
    pool: str
    group_id: str
    policy_version: int = Field(ge=0, description="policy version being served when the lease was made")
    model: str = Field(description="model name the harness should request from the proxy")
    proxy_url: str = Field(description="proxy base URL to create the session at (POST /sessions)")
    lease_deadline: float = Field(description="unix time after which the rollout may be handed to another runner")
    # False for an evaluation rollout: its completion is scored for pass@1 and never trained on, so the runner
    # opens an eval session at the proxy (`CreateSessionRequest.training`).
    training: bool = True


class LeaseResponse(_Wire):
    leases: list[Lease] = Field(default_factory=list)
    retry_after_s: float = Field(default=1.0, ge=0, description="when no lease was given, wait this long")
    done: bool = Field(default=False, description="training has finished: the runner may exit")
    renew_every_s: float = Field(default=30.0, gt=0, description="renew held leases (POST /v1/leases/renew) this often")


def renew_every(lease_ttl_s: float) -> float:
    """How often runners renew: three chances before a lease lapses."""
    return lease_ttl_s / 3


class LeaseRenewal(_Wire):
    """The leases a runner is still working on: each live one's deadline moves to now + the lease TTL, so a lease
    outlives a slow harness but not a dead runner."""

    runner_id: str = Field(min_length=1, max_length=253)
    lease_ids: list[str] = Field(max_length=1024)


class LeaseRenewalResponse(_Wire):
    renewed: list[str] = Field(default_factory=list, description="the lease ids still live (others expired or finished)")


class LeaseRelease(_Wire):
    """Sent by a runner as it starts: whatever an earlier process with its id held for its pool is lost (it crashed
    or was killed), so those rollouts go out again now instead of at their expiry. Runner ids are unique per live
    runner of a pool (the pod name on a cluster)."""

    runner_id: str = Field(min_length=1, max_length=253)
    pool: str = Field(min_length=1, max_length=253)


class LeaseReleaseResponse(_Wire):
    released: int = Field(ge=0, description="leases handed back")


class Timings(_Wire):
    started_at: float = Field(description="unix time the runner started the rollout")
    finished_at: float = Field(description="unix time the grade was known")
    harness_s: float = Field(default=0.0, ge=0)
    grade_s: float = Field(default=0.0, ge=0)

    @property
    def seconds(self) -> float:
        """The rollout's time from start to grade (its sandbox's life): what usage and the runner's metrics count."""
        return max(0.0, self.finished_at - self.started_at)


class Completion(_Wire):
    rollout_id: str
    lease_id: str
    runner_id: str = ""
    session_id: str | None = Field(default=None, description="proxy session holding the captured turns")
    session_base_url: str | None = Field(
        default=None, description="proxy replica owning the session (POST /sessions base_url); default lease's proxy_url"
    )
    outcome: OutcomeKind
    correctness: float = Field(
        default=0.0, ge=0.0, le=1.0, description="grader's correctness in [0, 1]; 1 for solved"
    )
    tool_calls: int = Field(default=0, ge=0, description="tool calls the agent made (for the reward bonus)")
    unknown_tool_calls: int = Field(default=0, ge=0, description="of those, calls to a tool the harness did not offer")
    invalid_tool_calls: int = Field(default=0, ge=0, description="of those, calls the tool's argument schema refuses")
    prefix_breaks: dict[BreakCause, int] = Field(
        default_factory=dict, description="calls that started one more training sequence, by cause"
    )
    grader_output: str = Field(default="", max_length=65536)
    timings: Timings | None = None
    error: str | None = Field(default=None, max_length=8192)


class AckStatus(StrEnum):
    accepted = "accepted"  # first completion of this rollout: counted
    duplicate = "duplicate"  # the rollout was already completed: ignored


class CompletionAck(_Wire):
    rollout_id: str
    status: AckStatus
    scored: bool = Field(description="the outcome counts toward training (not an infra/grader failure)")
    reward: float | None = Field(default=None, description="reward given, when scored")


def wilson_interval(solved: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a pass rate (95% by default): unlike p ± z·se it stays inside [0, 1] and is
    not empty at 0/n or n/n, which small evaluations hit often."""
    if n <= 0:
        return (math.nan, math.nan)
    p = solved / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


class PoolScore(BaseModel):
    """pass@1 of one pool in one evaluation: the fraction of scored attempts that were solved (None when none
    was scored)."""

    pool: str
    harness: str
    rollouts: int
    scored: int
    solved: int
    unscored: int
    pending: int
    pass_at_1: float | None
    mean_correctness: float | None

    def interval(self) -> tuple[float, float]:
        """The 95% Wilson interval of pass_at_1; (nan, nan) when nothing was scored."""
        return wilson_interval(self.solved, self.scored)


class EvalRecord(_Wire):
    """One evaluation round of a training run: pass@1 of the policy of `step` under each eval pool.
    A line of the run's eval.jsonl and the latest one in CoordinatorStatus."""

    step: int = Field(ge=0)
    policy_version: int = Field(ge=0)
    model: str
    time: float
    tasks: int = Field(ge=0)
    attempts: int = Field(ge=1)
    pools: list[PoolScore]  # on the held-out (test) split: what the model card and report give
    # On the validation split (TrainingRun spec.eval.validationSplit), scored in the same round; empty without one.
    validation: list[PoolScore] = Field(default_factory=list)

    def pass_at1(self) -> dict[str, float]:
        """pass@1 by pool name, for the pools with at least one scored attempt."""
        return {p.pool: p.pass_at_1 for p in self.pools if p.pass_at_1 is not None}

    def selection(self) -> list[PoolScore]:
        """The scores a checkpoint is chosen and the collapse alarm raised by: the validation split's where the
        round has one, so the test split's pass@1 of the chosen checkpoint is not the maximum it was chosen as."""
        return self.validation or self.pools


class EvalRegression(_Wire):
    """A pool whose held-out pass@1 fell well below its best: the latest round's 95% Wilson upper bound is under
    the pass@1 of the pool's best earlier round, so the drop is more than sampling noise (the collapse alarm)."""

    pool: str
    best_step: int
    best_pass_at_1: float
    step: int
    pass_at_1: float

    def describe(self) -> str:
        return (f"{self.pool} held-out pass@1 fell from {self.best_pass_at_1:.2f} (step {self.best_step}) "
                f"to {self.pass_at_1:.2f} (step {self.step})")


def eval_regressions(records: list[EvalRecord]) -> list[EvalRegression]:
    """The pools of the latest round (by step) whose pass@1 fell well below their best earlier round's, on the
    validation split where the rounds have one (`EvalRecord.selection`)."""
    if len(records) < 2:
        return []
    *earlier, latest = sorted(records, key=lambda r: r.step)
    found = []
    for score in latest.selection():
        if score.pass_at_1 is None:
            continue
        before = [(s.pass_at_1, -r.step) for r in earlier for s in r.selection()
                  if s.pool == score.pool and s.pass_at_1 is not None]
        if not before:
            continue
        best, minus_step = max(before)  # the best round; of equal ones, the earliest
        if score.interval()[1] < best:
            found.append(EvalRegression(pool=score.pool, best_step=-minus_step, best_pass_at_1=best, step=latest.step,
                                        pass_at_1=score.pass_at_1))
    return found


class EvalProgress(_Wire):
    """The evaluation round in progress: training steps wait until it is done."""

    step: int = Field(ge=0)
    policy_version: int = Field(ge=0)
    rollouts: int = Field(ge=0)
    finished: int = Field(ge=0)


class PoolRollouts(_Wire):
    """A pool's rollouts as the HarnessPool status counts them (training and evaluation alike)."""

    active: int = Field(default=0, ge=0, description="leased now")
    completed: int = Field(default=0, ge=0, description="graded: solved or wrong")
    failed: int = Field(default=0, ge=0, description="ended in an error (harness, grader or infrastructure)")
    timed_out: int = Field(default=0, ge=0, description="stopped by the wall-clock or step budget")
    grader_failures: int = Field(default=0, ge=0, description="of `failed`: the grader timed out or wrote no "
                                 "reward on the candidate's work (scored as a failure)")
    unknown_tool_calls: int = Field(default=0, ge=0, description="tool calls to a tool the harness did not offer")
    invalid_tool_calls: int = Field(default=0, ge=0, description="tool calls the tool's argument schema refused")
    prefix_breaks: dict[BreakCause, int] = Field(
        default_factory=dict, description="calls that started one more training sequence, by cause"
    )
    # What the scored training rollouts captured: their sequences per rollout is sequences / captured_rollouts.
    captured_rollouts: int = Field(default=0, ge=0, description="scored training rollouts")
    sequences: int = Field(default=0, ge=0, description="training sequences of those rollouts")
    sampled_tokens: int = Field(default=0, ge=0, description="sampled tokens in those sequences (the loss's)")
    sandbox_seconds: float = Field(default=0.0, ge=0, description="rollouts' time from start to grade (sandboxes "
                                   "alive), training and evaluation: what a chargeback counts")


class CoordinatorStatus(BaseModel):
    """What `GET /v1/status` serves; its readers (the operator, the live view) use this model."""

    # Readers ignore fields they do not know: an operator older than the learner it watches still reads it.
    model_config = ConfigDict(extra="ignore")

    step: int
    policy_version: int
    open_groups: int
    ready_groups: int
    leased: int
    rollouts_scored: int
    rollouts_unscored: int
    rollouts_stale: int
    groups_skipped_zero_variance: int
    policy_model: str
    done: bool
    # Everything below arrived later: defaulted, so a status from an older learner still reads.
    mean_reward: float | None = Field(default=None, description="mean reward of the rollouts the last step consumed")
    pass_at1: dict[str, float] = Field(default_factory=dict, description="latest evaluation's pass@1 by pool")
    eval_regressions: list[EvalRegression] = Field(
        default_factory=list, description="pools whose latest held-out pass@1 fell well below their best"
    )
    last_eval: EvalRecord | None = None
    evaluating: EvalProgress | None = None
    latest_checkpoint: str | None = Field(default=None, description="the newest checkpoint written")
    hub_revision: str | None = Field(default=None, description="Hub branch of the latest export")
    export_error: str | None = Field(default=None, description="why the last Hub export failed (None: it did not)")
    pools: dict[str, PoolRollouts] = Field(default_factory=dict, description="rollouts by pool")
    tokens_trained: int = Field(default=0, ge=0, description="tokens (prompt and sampled) of every optimiser step")


class CoordinatorClient:
    """The runner's side of the four POST routes, with the run's runner token. A failed call raises
    httpx.HTTPError (httpx.HTTPStatusError for an answer outside 2xx, 401 for a wrong token); a reply that is not
    the contract's model raises ValueError."""

    def __init__(self, http: httpx.AsyncClient, base_url: str, token: str) -> None:
        self.http = http
        self.base_url = base_url.rstrip("/")
        self.headers = bearer(token)

    async def _post(self, path: str, request: BaseModel) -> httpx.Response:
        return await self.http.post(self.base_url + path, json=request.model_dump(mode="json"), headers=self.headers)

    async def lease(self, request: LeaseRequest) -> LeaseResponse:
        return reply(await self._post(LEASES_PATH, request), LeaseResponse)

    async def renew(self, request: LeaseRenewal) -> LeaseRenewalResponse:
        return reply(await self._post(RENEW_PATH, request), LeaseRenewalResponse)

    async def release(self, request: LeaseRelease) -> LeaseReleaseResponse:
        return reply(await self._post(RELEASE_PATH, request), LeaseReleaseResponse)

    async def complete(self, completion: Completion) -> CompletionAck | None:
        """The coordinator's ack, or None when it does not know the rollout (404: it never planned it, e.g. it
        restarted from a checkpoint older than the lease)."""
        response = await self._post(COMPLETIONS_PATH, completion)
        if response.status_code == 404:
            return None
        return reply(response, CompletionAck)
