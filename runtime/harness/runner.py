"""The HarnessPool runner: lease a rollout, open a capture session, run the harness in a sandbox, grade, complete.

Outcomes (contracts/coordinator.py OutcomeKind). The rule: whatever the candidate (the harness and the policy
driving it) could have caused is the candidate's failure, scored with the task's failure reward (0) and trained
on; only what it could not have caused is left unscored. The same rule holds in every sandbox kind and in
evaluation.
- solved / wrong: the verifier ran and wrote a reward; correctness is that reward.
- timeout: the harness ran past its wall-clock limit, or stopped on its step budget (its own or the proxy's).
- harness_error: the harness failed on the model's output (or crashed) while the proxy was healthy.
- grader_timeout / grader_no_reward: the verifier ran past its limit, or wrote no usable reward, on the
  candidate's work (an endless loop, a FIFO for an answer, a crash the candidate's code caused). Scored 0,
  unless the task's grader fails on its own reference answer too (below).
- grader_error: the verifier failed on the candidate AND on the task's reference answer (solution/solve.sh, run
  once per task in a fresh sandbox): the grader is broken, which says nothing about the policy. Unscored. A task
  without a reference answer gets no such check: its grader failures are the candidate's.
- infra_error: proxy unreachable, sandbox failure, unknown task, an engine that was down, or any unexpected error
  in a rollout step (logged with its traceback). Retried in place `infra_retries` times, then completed as
  infra_error, which the coordinator leaves unscored (never reward 0).
Every leased rollout is completed with one of these while its runner lives. While a rollout runs its lease is
renewed (every `renew_every_s` the coordinator names), so a lease expires only when its runner is gone. A rollout
cancelled by shutdown is not completed: its lease expires and the coordinator hands it out again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from harnessrl.runtime.contracts.coordinator import (
    Completion,
    CompletionAck,
    CoordinatorClient,
    Lease,
    LeaseRelease,
    LeaseRenewal,
    LeaseRequest,
    LeaseResponse,
    OutcomeKind,
    Timings,
    read_runner_token,
)
from harnessrl.runtime.contracts.proxy import (
    CreateSessionRequest,
    CreateSessionResponse,
    DialectBaseUrls,
    ProxyClient,
    SessionInfo,
    SessionStatus,
)
from harnessrl.runtime.contracts.runner_config import Dialect, RunnerConfig
from harnessrl.runtime.harness.adapters.base import Adapter, HarnessStatus, RunContext, RunOutput
from harnessrl.runtime.harness.metrics import RunnerMetrics
from harnessrl.runtime.harness.sandboxes.base import Sandbox, SandboxError, SandboxProvider
from harnessrl.runtime.harness.tasks import Task
from harnessrl.runtime.trajectory.models import BreakCause

log = logging.getLogger(__name__)


# Longest pause in leasing while rollouts keep failing on the infrastructure (see Runner.note_outcome).
INFRA_BACKOFF_MAX_S = 15.0


def dialect_base_url(urls: DialectBaseUrls, dialect: Dialect) -> str:
    """The base URL a harness of this dialect is given (each SDK appends its own path)."""
    if dialect in ("openai_chat", "openai_responses"):
        return urls.openai
    return urls.anthropic if dialect == "anthropic" else urls.gemini


@dataclass
class Attempt:
    """What one try of a rollout produced (before it becomes a Completion)."""

    outcome: OutcomeKind
    session_id: str | None = None
    session_base_url: str | None = None
    correctness: float = 0.0
    tool_calls: int = 0
    unknown_tool_calls: int = 0
    invalid_tool_calls: int = 0
    prefix_breaks: dict[BreakCause, int] = field(default_factory=dict)
    grader_output: str = ""
    error: str | None = None
    harness_s: float = 0.0
    grade_s: float = 0.0


def unexpected(lease: Lease, exc: Exception, session_id: str | None = None) -> Attempt:
    """An error no step expected (a bug, an unforeseen failure): logged with its traceback, and an infrastructure
    failure of the rollout, so the rollout still ends with an outcome."""
    log.error("rollout %s: unexpected error", lease.rollout_id, exc_info=exc)
    return Attempt(OutcomeKind.infra_error, session_id=session_id, error=f"runner error: {type(exc).__name__}: {exc}")


class Runner:
    def __init__(
        self,
        config: RunnerConfig,
        adapter: Adapter,
        provider: SandboxProvider,
        tasks: dict[str, Task],
        http: httpx.AsyncClient,
    ) -> None:
        self.config = config
        self.adapter = adapter
        self.provider = provider
        self.tasks = tasks
        # One credential for both: the coordinator's lease routes and the proxy's session routes.
        token = read_runner_token(config.runner_token_file)
        self.proxy = ProxyClient(http, token)
        self.coordinator = CoordinatorClient(http, str(config.coordinator_url), token)
        self.harness_name = config.harness.name
        self.completed: list[Completion] = []
        self.infra_streak = 0  # infra_error completions in a row
        self.lease_after = 0.0  # monotonic time before which no new rollout is leased
        self.held: set[str] = set()  # lease ids of the rollouts running now
        # Task id -> whether its grader fails on its reference answer (see grader_fails_on_reference).
        self.reference_checks: dict[str, asyncio.Future[bool]] = {}
        self.renew_every_s = LeaseResponse().renew_every_s  # the coordinator's word replaces it on each lease
        self.metrics = RunnerMetrics(config.pool, self.harness_name)
        self.metrics.observe_active(lambda: float(len(self.held)))

    # ------------------------------------------------------------------ one rollout

    async def rollout(self, lease: Lease) -> Completion:
        """Run a leased rollout to its Completion, retrying infrastructure failures in place."""
        started = time.time()
        attempt = Attempt(outcome=OutcomeKind.infra_error)
        for n in range(self.config.infra_retries + 1):
            try:
                attempt = await self.attempt(lease)
            except Exception as exc:  # as in attempt(), for the steps before the sandbox
                attempt = unexpected(lease, exc)
            if attempt.outcome != OutcomeKind.infra_error:
                break
            log.warning("rollout %s: infra error (try %d): %s", lease.rollout_id, n + 1, attempt.error)
            if n < self.config.infra_retries:
                await self.close(attempt.session_id, attempt.session_base_url, lease)
        return Completion(
            rollout_id=lease.rollout_id,
            lease_id=lease.lease_id,
            runner_id=self.config.runner_id,
            session_id=attempt.session_id,
            session_base_url=attempt.session_base_url,
            outcome=attempt.outcome,
            correctness=attempt.correctness,
            tool_calls=attempt.tool_calls,
            unknown_tool_calls=attempt.unknown_tool_calls,
            invalid_tool_calls=attempt.invalid_tool_calls,
            prefix_breaks=attempt.prefix_breaks,
            grader_output=attempt.grader_output[-65536:],
            timings=Timings(
                started_at=started, finished_at=time.time(), harness_s=attempt.harness_s, grade_s=attempt.grade_s
            ),
            error=attempt.error[:8192] if attempt.error else None,
        )

    async def attempt(self, lease: Lease) -> Attempt:
        task = self.tasks.get(lease.task_id)
        if task is None:
            return Attempt(OutcomeKind.infra_error, error=f"task {lease.task_id!r} is not in this runner's task set")
        proxy_url = self.proxy_url(lease)
        request = CreateSessionRequest(
            rollout_id=lease.rollout_id,
            task_id=lease.task_id,
            harness=self.harness_name,
            group_id=lease.group_id,
            call_budget=self.config.step_budget,
            training=lease.training,
            metadata={"pool": self.config.pool, "runner": self.config.runner_id},
        )
        try:
            session = await self.proxy.create_session(proxy_url, request)
        except httpx.HTTPStatusError as exc:
            refused = f"proxy refused POST /sessions: HTTP {exc.response.status_code} {exc.response.text[:300]}"
            return Attempt(OutcomeKind.infra_error, error=refused)
        except httpx.HTTPError as exc:
            return Attempt(OutcomeKind.infra_error,
                           error=f"proxy unreachable at {proxy_url}: {type(exc).__name__}: {exc}")
        try:
            sandbox = await self.provider.open(lease.rollout_id, task)
            async with sandbox:
                return await self.run_in(sandbox, task, lease, proxy_url, session)
        except SandboxError as exc:
            return Attempt(OutcomeKind.infra_error, session_id=session.session_id, error=str(exc))
        except Exception as exc:  # a failure in any step still ends the rollout with an outcome
            return unexpected(lease, exc, session.session_id)

    async def run_in(
        self, sandbox: Sandbox, task: Task, lease: Lease, proxy_url: str, session: CreateSessionResponse
    ) -> Attempt:
        sid = session.session_id
        ctx = RunContext(
            instruction=task.instruction,
            model=lease.model or self.config.model or session.model,
            base_url=sandbox.proxy_url(dialect_base_url(session.dialect_base_urls, self.adapter.dialect)),
            api_key=sid,
            step_budget=self.config.step_budget,
            home=sandbox.home,
            workspace=sandbox.workspace,
        )
        invocation = self.adapter.invocation(ctx)
        await sandbox.write_files(invocation.files)
        timeout = min(self.config.timeouts.harness_s, task.config.agent.timeout_sec or float("inf"))
        run = await sandbox.run(invocation.argv, invocation.env, timeout)
        info = await self.session_info(session.base_url or proxy_url, sid)
        base = Attempt(
            OutcomeKind.timeout, session_id=sid, session_base_url=session.base_url, harness_s=run.duration_s,
            tool_calls=info.tool_calls if info else 0,
            unknown_tool_calls=info.unknown_tool_calls if info else 0,
            invalid_tool_calls=info.invalid_tool_calls if info else 0,
            prefix_breaks=info.prefix_breaks if info else {},
        )
        # A harness that met a dead or restarting engine (calls refused, a stream cut) and then failed or ran out
        # of time says nothing about the policy: the rollout is unscored and leased again.
        engine_down = f"the proxy had no engine for {info.engine_failures} call(s)" if info and info.engine_failures else ""
        if run.limit_exceeded:  # the sandbox stopped it: the candidate's doing
            base.outcome, base.error = OutcomeKind.harness_error, run.limit_exceeded
            return base
        if run.timed_out:
            base.outcome = OutcomeKind.infra_error if engine_down else OutcomeKind.timeout
            base.error = engine_down or f"harness ran past {timeout:.0f}s"
            return base
        collected = {path: await sandbox.read_file(path) for path in invocation.collect}
        result = self.adapter.result(
            RunOutput(exit_code=run.exit_code, stdout=run.stdout, stderr=run.stderr, collected=collected)
        )
        if result.status != HarnessStatus.finished:
            if info is None:
                # The harness failed and the proxy is gone: the failure is the infrastructure's, not the policy's.
                base.outcome, base.error = OutcomeKind.infra_error, f"proxy unreachable after harness failure: {result.detail}"
            elif engine_down:
                base.outcome, base.error = OutcomeKind.infra_error, f"{engine_down}: {result.detail}"
            elif result.status == HarnessStatus.step_budget or info.status == SessionStatus.budget_exhausted:
                base.outcome, base.error = OutcomeKind.timeout, f"step budget spent: {result.detail}"
            else:
                base.outcome, base.error = OutcomeKind.harness_error, result.detail or f"exit code {run.exit_code}"
            return base
        grade_timeout = min(self.config.timeouts.grader_s, task.config.verifier.timeout_sec or float("inf"))
        t0 = time.monotonic()
        graded = await sandbox.grade(task, grade_timeout)
        base.grade_s = time.monotonic() - t0
        base.grader_output = graded.output
        if graded.grade is None:
            base.error = graded.error
            if await self.grader_fails_on_reference(task, grade_timeout):
                base.outcome = OutcomeKind.grader_error
                base.error = f"{graded.error}; the grader fails on the task's reference answer too"
            else:
                base.outcome = OutcomeKind.grader_timeout if graded.timed_out else OutcomeKind.grader_no_reward
            return base
        base.correctness = graded.grade.reward
        base.outcome = OutcomeKind.solved if graded.grade.reward >= 1.0 else OutcomeKind.wrong
        return base

    async def grader_fails_on_reference(self, task: Task, timeout_s: float) -> bool:
        """Whether the task's grader fails to pass its own reference answer in a fresh sandbox: then a grader
        failure on a candidate says nothing about it. Checked once per task (concurrent rollouts share the check);
        False for a task without a reference answer. A sandbox failure during the check raises SandboxError."""
        if not task.has_reference:
            return False
        check = self.reference_checks.get(task.id)
        if check is None or (check.done() and (check.cancelled() or check.exception() is not None)):
            check = self.reference_checks[task.id] = asyncio.ensure_future(self.check_reference(task, timeout_s))
        return await asyncio.shield(check)

    async def check_reference(self, task: Task, timeout_s: float) -> bool:
        sandbox = await self.provider.open(f"reference-{task.id}", task)
        async with sandbox:
            solved = await sandbox.run_reference(task, self.config.timeouts.harness_s)
            graded = await sandbox.grade(task, timeout_s)
        broken = graded.grade is None or graded.grade.reward < 1.0
        log.warning("task %s: its grader %s on its reference answer (solve.sh exit %d)%s", task.id,
                    "fails" if broken else "passes", solved.exit_code, f": {graded.error}" if graded.error else "")
        return broken

    async def session_info(self, proxy_url: str, session_id: str) -> SessionInfo | None:
        """The session's state, or None if the proxy cannot be reached (or does not answer)."""
        try:
            return await self.proxy.session(proxy_url, session_id)
        except httpx.HTTPError:
            return None

    # ------------------------------------------------------------------ coordinator

    async def lease(self, n: int) -> LeaseResponse:
        request = LeaseRequest(runner_id=self.config.runner_id, pool=self.config.pool, harness=self.harness_name, max=n)
        return await self.coordinator.lease(request)

    async def release_predecessor(self) -> None:
        """Hand back what an earlier process of this runner (same id and pool, so it is gone) still held, so
        those rollouts go out again now rather than when their leases expire. Best effort: they expire anyway."""
        request = LeaseRelease(runner_id=self.config.runner_id, pool=self.config.pool)
        try:
            released = (await self.coordinator.release(request)).released
        except httpx.HTTPError as exc:
            log.info("could not release an earlier runner's leases (%s); they will expire", exc)
            return
        if released:
            log.info("released %d lease(s) an earlier process of runner %s held", released, self.config.runner_id)

    async def renew(self) -> None:
        """Renew the leases of the running rollouts (best effort: a missed renewal is retried on the next tick)."""
        request = LeaseRenewal(runner_id=self.config.runner_id, lease_ids=sorted(self.held))
        try:
            renewed = (await self.coordinator.renew(request)).renewed
        except httpx.HTTPError as exc:
            log.warning("renewing %d lease(s) failed: %s", len(request.lease_ids), exc)
            return
        lost = set(request.lease_ids) - set(renewed)
        if lost:
            # Expired (the coordinator restarted from an older checkpoint, or this runner stalled): the rollout
            # runs on; whichever completion of it arrives first counts.
            log.info("lease(s) no longer held: %s", ", ".join(sorted(lost)))

    async def keep_leases(self) -> None:
        last = time.monotonic()
        while True:
            # Ticks of at most a second: the interval is the coordinator's, learnt from the lease responses.
            await asyncio.sleep(min(1.0, self.renew_every_s))
            if self.held and time.monotonic() - last >= self.renew_every_s:
                last = time.monotonic()
                await self.renew()

    async def complete(self, completion: Completion) -> CompletionAck | None:
        """Report a completion; retried with backoff (the coordinator dedupes by rollout id)."""
        for attempt in range(5):
            try:
                ack = await self.coordinator.complete(completion)
            except httpx.HTTPError as exc:
                log.warning("completing %s failed (%s); retrying", completion.rollout_id, exc)
                await asyncio.sleep(min(2**attempt, 10))
                continue
            if ack is None:
                log.warning("coordinator does not know rollout %s (expired?)", completion.rollout_id)
            return ack
        log.error("gave up completing %s; its lease will expire and be re-leased", completion.rollout_id)
        return None

    def proxy_url(self, lease: Lease) -> str:
        return lease.proxy_url or (str(self.config.proxy_url) if self.config.proxy_url else "")

    async def close(self, session_id: str | None, base_url: str | None, lease: Lease) -> None:
        proxy_url = base_url or self.proxy_url(lease)
        if session_id is not None and proxy_url:
            # Ends a session nobody will read again, so the proxy's session table does not fill up (best effort:
            # a session left open expires with the proxy's TTL).
            try:
                await self.proxy.close_session(proxy_url, session_id)
            except (httpx.HTTPError, ValueError) as exc:
                log.info("closing session %s: %s", session_id, exc)

    async def run_and_complete(self, lease: Lease) -> None:
        log.info("rollout %s: task %s (group %s, policy v%d)", lease.rollout_id, lease.task_id, lease.group_id, lease.policy_version)
        self.held.add(lease.lease_id)  # until the coordinator has the completion
        try:
            await self.run_to_ack(lease)
        finally:
            self.held.discard(lease.lease_id)

    async def run_to_ack(self, lease: Lease) -> None:
        completion = await self.rollout(lease)
        self.completed.append(completion)
        self.metrics.completed(completion)
        self.note_outcome(completion.outcome)
        t = completion.timings
        log.info(
            "rollout %s: %s correctness=%.2f tool_calls=%d harness=%.1fs grade=%.1fs%s",
            lease.rollout_id,
            completion.outcome.value,
            completion.correctness,
            completion.tool_calls,
            t.harness_s if t else 0.0,
            t.grade_s if t else 0.0,
            f" ({completion.error[:200]})" if completion.error else "",
        )
        ack = await self.complete(completion)
        if ack is None:
            self.metrics.unacked.inc()
        else:
            # The coordinator has what it needs of the session (it fetched the sequences before acking).
            await self.close(completion.session_id, completion.session_base_url, lease)
            reward = "unscored" if ack.reward is None else f"reward {ack.reward:.3f}"
            log.info("rollout %s: %s by the coordinator (%s)", lease.rollout_id, ack.status.value, reward)

    # ------------------------------------------------------------------ loop

    def note_outcome(self, outcome: OutcomeKind) -> None:
        """Back off leasing while rollouts fail on the infrastructure (an engine restarting, the proxy down): each
        new one would fail at once, burn one of its slot's attempts, and take CPU the restart needs."""
        if outcome == OutcomeKind.infra_error:
            self.infra_streak += 1
            self.lease_after = time.monotonic() + min(2.0**self.infra_streak, INFRA_BACKOFF_MAX_S)
        else:
            self.infra_streak, self.lease_after = 0, 0.0

    async def serve(self, stop: asyncio.Event) -> None:
        """Lease and run rollouts, `concurrency` at a time, until `stop` is set or the coordinator is done.
        On stop, running rollouts are cancelled (their sandboxes kill the harness) and not completed."""
        await self.provider.start()
        await self.release_predecessor()
        active: set[asyncio.Task[None]] = set()
        renewer = asyncio.create_task(self.keep_leases(), name="renew-leases")
        try:
            while not stop.is_set():
                free = self.config.concurrency - len(active)
                backoff_s = self.lease_after - time.monotonic()
                if free > 0 and backoff_s <= 0:
                    try:
                        leased = await self.lease(free)
                    except (httpx.HTTPError, ValueError) as exc:
                        log.warning("lease failed: %s", exc)
                        self.metrics.lease_errors.inc()
                        leased = LeaseResponse(retry_after_s=2.0)
                    self.metrics.leases.inc(len(leased.leases))
                    if leased.done and not active:
                        log.info("coordinator says training is done")
                        break
                    self.renew_every_s = leased.renew_every_s
                    for lease in leased.leases:
                        t = asyncio.create_task(self.run_and_complete(lease), name=lease.rollout_id)
                        active.add(t)
                        t.add_done_callback(active.discard)
                    # Done: finish what is running, then ask once more (and stop).
                    wait_s = 3600.0 if leased.done else 0.0 if leased.leases else leased.retry_after_s
                else:
                    wait_s = backoff_s if free > 0 else 3600.0
                await wait_any(stop, active, wait_s)
        finally:
            renewer.cancel()
            pending: list[asyncio.Future[Any]] = [*active, *self.reference_checks.values()]
            for f in pending:
                f.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(renewer, *pending, return_exceptions=True)
            await self.provider.shutdown()


async def wait_any(stop: asyncio.Event, active: set[asyncio.Task[None]], timeout_s: float) -> None:
    """Sleep until stop is set, an active rollout finishes, or timeout_s passes."""
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({stopper, *active}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
