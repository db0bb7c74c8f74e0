"""How the runner turns what happened into an outcome, with the sandbox and the proxy replaced by in-memory
stand-ins (a Sandbox subclass; httpx's MockTransport answering the proxy's admin API from its protocol models).
The real processes and servers are exercised in tests/integration/test_runner_*.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from harnessrl.runtime.contracts.coordinator import (
    Completion,
    CompletionAck,
    Lease,
    LeaseRelease,
    LeaseReleaseResponse,
    LeaseRequest,
    LeaseResponse,
    OutcomeKind,
)
from harnessrl.runtime.contracts.proxy import (
    CreateSessionResponse,
    DialectBaseUrls,
    SessionInfo,
    SessionStatus,
)
from harnessrl.runtime.contracts.runner_config import RunnerConfig
from harnessrl.runtime.harness.adapters import adapter_for
from harnessrl.runtime.harness.runner import Runner
from harnessrl.runtime.harness.sandboxes.base import (
    ExecResult,
    InPlaceGradingSandbox,
    SandboxError,
    SandboxProvider,
)
from harnessrl.runtime.harness.tasks import Task, load_dir
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"
ALL_TASKS = load_dir(TASKS)


class FakeSandbox(InPlaceGradingSandbox):
    def __init__(self, run_result: ExecResult, reward_txt: str | None,
                 grade_result: ExecResult | None = None, fail_in: str | None = None) -> None:
        self.home, self.workspace, self.tests_dir, self.logs_dir = "/h", "/w", "/t", "/l"
        self.run_result, self.reward_txt = run_result, reward_txt
        self.grade_result = grade_result or ExecResult(exit_code=0, stdout="graded")
        self.fail_in = fail_in  # the step that raises (a failure nobody planned for)
        self.files: dict[str, str] = {}
        self.runs: list[list[str]] = []
        self.closed = False

    def step(self, name: str) -> None:
        if self.fail_in == name:
            raise FileExistsError(f"{name} failed")

    async def write_files(self, files: dict[str, str]) -> None:
        self.step("write_files")
        self.files.update(files)

    async def read_file(self, path: str) -> str | None:
        self.step("read_file")
        return self.reward_txt if path == "/l/verifier/reward.txt" else self.files.get(path)

    async def run(self, argv: list[str], env: dict[str, str], timeout_s: float, cwd: str | None = None) -> ExecResult:
        self.step("run")
        self.runs.append(argv)
        return self.run_result if len(self.runs) == 1 else self.grade_result

    async def put_tests(self, task: Task) -> None:
        self.step("put_tests")

    async def close(self) -> None:
        self.closed = True
        self.step("close")


class FakeProvider(SandboxProvider):
    def __init__(self, sandboxes: list[FakeSandbox | SandboxError]) -> None:
        self.queue = sandboxes
        self.opened: list[FakeSandbox] = []

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    async def open(self, rollout_id: str, task: Task) -> FakeSandbox:
        item = self.queue.pop(0)
        if isinstance(item, SandboxError):
            raise item
        self.opened.append(item)
        return item


def proxy_transport(session_status: SessionStatus = SessionStatus.active, up: bool = True,
                    down_after_create: bool = False, engine_failures: int = 0,
                    closed: list[str] | None = None) -> httpx.MockTransport:
    state = {"created": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        if not up or (down_after_create and state["created"]):
            raise httpx.ConnectError("connection refused", request=request)
        assert request.headers["authorization"] == "Bearer runner"  # the runner token, not the admin one
        if request.method == "POST" and request.url.path == "/sessions":
            state["created"] += 1
            resp = CreateSessionResponse(
                session_id=f"sess{state['created']}", base_url="http://proxy:8080", replica_id="proxy-0",
                dialect_base_urls=DialectBaseUrls(openai="http://proxy:8080/v1", anthropic="http://proxy:8080",
                                                  gemini="http://proxy:8080"),
                model="tiny", policy_version=0, call_budget=8)
            return httpx.Response(200, json=resp.model_dump())
        sid = request.url.path.rsplit("/", 1)[-1]
        if request.method == "DELETE" and closed is not None:
            closed.append(sid)
        info = SessionInfo(session_id=sid, rollout_id="r", task_id="t", harness="h", group_id="g", training=True,
                           metadata={}, status=session_status, call_budget=8, calls=3, turns=3, bad_turns=0,
                           tool_calls=2, errors=[], engine_failures=engine_failures, policy_versions=[0],
                           created_at=0, last_activity_at=0)
        return httpx.Response(200, json=info.model_dump())

    return httpx.MockTransport(handler)


def runner(provider: FakeProvider, transport: httpx.MockTransport, tmp_path: Path, harness: str = "qwen-code",
           retries: int = 0) -> Runner:
    (tmp_path / "runner-token").write_text("runner")
    config = RunnerConfig.model_validate({"runner_token_file": str(tmp_path / "runner-token"),
        "pool": "p", "harness": {"name": harness}, "tasks": {"kind": "dir", "path": str(TASKS)},
        "coordinator_url": "http://coordinator", "infra_retries": retries,
    })
    http = httpx.AsyncClient(transport=transport)
    return Runner(config, adapter_for(config.harness), provider, ALL_TASKS, http)


LEASE = Lease(rollout_id="r1", lease_id="l1", task_id="sales-total", harness="qwen-code", pool="p", group_id="g",
              policy_version=0, model="tiny", proxy_url="http://proxy:8080", lease_deadline=time.time() + 600)
OK_RESULT = '[{"type": "result", "subtype": "success", "is_error": false, "result": "done"}]'


@pytest.mark.parametrize(
    ("run", "reward", "session", "outcome", "correctness"),
    [
        (ExecResult(exit_code=0, stdout=OK_RESULT), "1", SessionStatus.active, OutcomeKind.solved, 1.0),
        (ExecResult(exit_code=0, stdout=OK_RESULT), "0.25", SessionStatus.active, OutcomeKind.wrong, 0.25),
        (ExecResult(exit_code=-9, timed_out=True), None, SessionStatus.active, OutcomeKind.timeout, 0.0),
        (ExecResult(exit_code=53), None, SessionStatus.active, OutcomeKind.timeout, 0.0),  # turn limit
        (ExecResult(exit_code=1, stderr="crash"), None, SessionStatus.budget_exhausted, OutcomeKind.timeout, 0.0),
        (ExecResult(exit_code=1, stderr="crash"), None, SessionStatus.active, OutcomeKind.harness_error, 0.0),
        # The sandbox stopped it at a limit (its disk): the candidate's failure, whatever the exit code says.
        (ExecResult(exit_code=0, stdout=OK_RESULT, limit_exceeded="disk"), "1", SessionStatus.active,
         OutcomeKind.harness_error, 0.0),
    ],
)
async def test_outcomes(tmp_path: Path, run: ExecResult, reward: str | None, session: SessionStatus,
                        outcome: OutcomeKind, correctness: float) -> None:
    sandbox = FakeSandbox(run, reward)
    r = runner(FakeProvider([sandbox]), proxy_transport(session), tmp_path)
    completion = await r.rollout(LEASE)
    assert completion.outcome == outcome, completion.error
    assert completion.correctness == correctness and completion.session_id == "sess1"
    assert completion.session_base_url == "http://proxy:8080" and completion.tool_calls == 2
    assert sandbox.closed
    # The harness got the proxy's chat URL and its session id as the key.
    assert sandbox.files["/h/.qwen/settings.json"] and sandbox.runs[0][0] == "qwen"


GRADER_HANGS = ExecResult(exit_code=-9, timed_out=True)


@pytest.mark.parametrize(
    ("grade", "reference_reward", "outcome"),
    [
        (None, "1", OutcomeKind.grader_no_reward),  # the reference passes: the candidate broke the grader
        (GRADER_HANGS, "1", OutcomeKind.grader_timeout),
        (None, None, OutcomeKind.grader_error),  # the grader fails on the reference answer too: unscored
        (GRADER_HANGS, None, OutcomeKind.grader_error),
    ],
)
async def test_a_grader_failure_is_the_candidates_unless_the_reference_fails_too(
        tmp_path: Path, grade: ExecResult | None, reference_reward: str | None, outcome: OutcomeKind) -> None:
    candidate = FakeSandbox(ExecResult(exit_code=0, stdout=OK_RESULT), None, grade_result=grade)
    reference = FakeSandbox(ExecResult(exit_code=0), reference_reward)
    provider = FakeProvider([candidate, reference])
    r = runner(provider, proxy_transport(), tmp_path)
    completion = await r.rollout(LEASE)
    assert completion.outcome == outcome and completion.correctness == 0.0, completion.error
    # The reference answer ran in a fresh sandbox: solve.sh written and run there, then graded.
    assert reference.closed and reference.runs[0] == ["bash", "/h/.reference/solve.sh"]
    assert "/h/.reference/solve.sh" in reference.files and reference.runs[1][-1] == "/t/test.sh"
    # Decided once per task: another grader failure on it opens no second reference sandbox.
    again = FakeSandbox(ExecResult(exit_code=0, stdout=OK_RESULT), None, grade_result=grade)
    provider.queue.append(again)
    assert (await r.rollout(LEASE)).outcome == outcome and not provider.queue


async def test_a_grader_failure_on_a_task_without_a_reference_is_the_candidates(tmp_path: Path) -> None:
    task = ALL_TASKS["sales-total"]
    bare = task.model_copy(update={"path": tmp_path / "bare"})
    (tmp_path / "bare").mkdir()
    candidate = FakeSandbox(ExecResult(exit_code=0, stdout=OK_RESULT), None, grade_result=GRADER_HANGS)
    r = runner(FakeProvider([candidate]), proxy_transport(), tmp_path)
    r.tasks = {"sales-total": bare}
    completion = await r.rollout(LEASE)
    assert completion.outcome == OutcomeKind.grader_timeout and "timed out" in (completion.error or "")


@pytest.mark.parametrize("step", ["write_files", "run", "read_file", "put_tests", "close", "open", "session"])
async def test_an_exception_in_any_rollout_step_still_completes_the_rollout(tmp_path: Path, step: str) -> None:
    """A failure no step planned for (here FileExistsError, as a replaced logs/ once raised) ends the rollout as
    an infrastructure failure with its cause, instead of killing the rollout's task and leaving its lease to
    expire."""
    sandbox = FakeSandbox(ExecResult(exit_code=0, stdout=OK_RESULT), "1", fail_in=step)
    provider = FakeProvider([sandbox])
    if step == "open":
        async def broken_open(rollout_id: str, task: Task) -> FakeSandbox:
            raise FileExistsError("open failed")
        provider.open = broken_open  # type: ignore[method-assign]
    transport = proxy_transport()
    if step == "session":
        def refuse(request: httpx.Request) -> httpx.Response:
            raise FileExistsError("session failed")
        transport = httpx.MockTransport(refuse)
    r = runner(provider, transport, tmp_path)
    completion = await r.rollout(LEASE)
    assert completion.outcome == OutcomeKind.infra_error
    assert completion.error == f"runner error: FileExistsError: {step} failed"


async def test_harness_failure_with_the_proxy_gone_is_infrastructure(tmp_path: Path) -> None:
    sandbox = FakeSandbox(ExecResult(exit_code=1, stderr="fetch failed"), None)
    r = runner(FakeProvider([sandbox]), proxy_transport(down_after_create=True), tmp_path)
    completion = await r.rollout(LEASE)
    assert completion.outcome == OutcomeKind.infra_error and "proxy unreachable" in (completion.error or "")


@pytest.mark.parametrize("run", [ExecResult(exit_code=1, stderr="HTTP 503"), ExecResult(exit_code=-9, timed_out=True)])
async def test_harness_failure_after_the_engine_was_unavailable_is_infrastructure(tmp_path: Path, run: ExecResult) -> None:
    """An engine restart refuses the harness's calls (the proxy counts them on the session): the failure that
    follows is not the policy's, so the rollout is unscored (and leased again) instead of rewarded 0."""
    r = runner(FakeProvider([FakeSandbox(run, None)]), proxy_transport(engine_failures=2), tmp_path)
    completion = await r.rollout(LEASE)
    assert completion.outcome == OutcomeKind.infra_error and "no engine for 2 call(s)" in (completion.error or "")
    # A harness that got through the outage (its retries answered) is scored as usual.
    good = FakeSandbox(ExecResult(exit_code=0, stdout=OK_RESULT), "1")
    completion = await runner(FakeProvider([good]), proxy_transport(engine_failures=2), tmp_path).rollout(LEASE)
    assert completion.outcome == OutcomeKind.solved


async def test_infra_errors_are_retried_in_place_then_reported(tmp_path: Path) -> None:
    good = FakeSandbox(ExecResult(exit_code=0, stdout=OK_RESULT), "1")
    r = runner(FakeProvider([SandboxError("node lost"), good]), proxy_transport(), tmp_path, retries=1)
    completion = await r.rollout(LEASE)
    assert completion.outcome == OutcomeKind.solved and completion.session_id == "sess2"  # a fresh session
    r = runner(FakeProvider([SandboxError("a"), SandboxError("b")]), proxy_transport(), tmp_path, retries=1)
    completion = await r.rollout(LEASE)
    assert completion.outcome == OutcomeKind.infra_error and completion.error == "b"
    unknown = LEASE.model_copy(update={"task_id": "no-such-task"})
    completion = await runner(FakeProvider([]), proxy_transport(), tmp_path).rollout(unknown)
    assert completion.outcome == OutcomeKind.infra_error and "no-such-task" in (completion.error or "")
    completion = await runner(FakeProvider([]), proxy_transport(up=False), tmp_path).rollout(LEASE)
    assert completion.outcome == OutcomeKind.infra_error and completion.session_id is None
    # The session of an attempt retried in place is closed at the proxy: nobody reads it again.
    closed: list[str] = []
    good = FakeSandbox(ExecResult(exit_code=0, stdout=OK_RESULT), "1")
    r = runner(FakeProvider([SandboxError("node lost"), good]), proxy_transport(closed=closed), tmp_path, retries=1)
    assert (await r.rollout(LEASE)).session_id == "sess2" and closed == ["sess1"]


def release_answer(request: httpx.Request, seen: list[LeaseRelease]) -> httpx.Response:
    seen.append(LeaseRelease.model_validate_json(request.content))
    return httpx.Response(200, json=LeaseReleaseResponse(released=0).model_dump())


async def test_serve_runs_leases_concurrently_and_stops_when_the_coordinator_is_done(tmp_path: Path) -> None:
    leases = [LEASE.model_copy(update={"rollout_id": f"r{i}", "lease_id": f"l{i}"}) for i in range(3)]
    completed: list[Completion] = []
    requests: list[LeaseRequest] = []
    closed: list[str] = []
    proxy = proxy_transport(closed=closed)

    released: list[LeaseRelease] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "proxy":
            return proxy.handler(request)  # type: ignore[no-any-return]
        if request.url.path == "/v1/leases/release":
            return release_answer(request, released)
        if request.url.path == "/v1/leases":
            req = LeaseRequest.model_validate_json(request.content)
            requests.append(req)
            given = [leases.pop(0) for _ in range(min(req.max, len(leases)))]
            return httpx.Response(200, json=LeaseResponse(leases=given, done=not given and not leases).model_dump())
        c = Completion.model_validate_json(request.content)
        completed.append(c)
        return httpx.Response(200, json=CompletionAck(rollout_id=c.rollout_id, status="accepted", scored=True).model_dump())

    sandboxes = [FakeSandbox(ExecResult(exit_code=0, stdout=OK_RESULT), "1") for _ in range(3)]
    r = runner(FakeProvider(list(sandboxes)), httpx.MockTransport(handler), tmp_path)
    r.config.concurrency = 2
    await asyncio.wait_for(r.serve(asyncio.Event()), 30)
    assert sorted(c.rollout_id for c in completed) == ["r0", "r1", "r2"]
    assert all(c.outcome == OutcomeKind.solved for c in completed)
    assert requests[0].max == 2 and requests[0].pool == "p" and requests[0].harness == "qwen-code"
    # Before its first lease the runner hands back whatever an earlier process of it held for its pool.
    assert released == [LeaseRelease(runner_id=r.config.runner_id, pool="p")]
    assert all(s.closed for s in sandboxes)
    # Each session is closed at the proxy once the coordinator has acked its completion (it fetched the
    # sequences first), so a long run never fills the proxy's session table.
    assert sorted(closed) == ["sess1", "sess2", "sess3"]
    # Its /metrics counts them: three solved, three leased, none running now.
    samples = {(m.name, tuple(sorted(m.labels.items()))): m.value for f in
               text_string_to_metric_families(generate_latest(r.metrics.registry).decode()) for m in f.samples}
    labels = (("harness", "qwen-code"), ("pool", "p"))
    assert samples[("harnessrl_runner_rollouts_total", (("harness", "qwen-code"), ("outcome", "solved"), ("pool", "p")))] == 3
    assert samples[("harnessrl_runner_leases_total", labels)] == 3
    assert samples[("harnessrl_runner_active_rollouts", labels)] == 0
    assert samples[("harnessrl_runner_rollout_seconds_count", labels)] == 3
    assert samples[("harnessrl_runner_lease_errors_total", labels)] == 0


async def test_serve_backs_off_leasing_while_rollouts_fail_on_the_infrastructure(tmp_path: Path) -> None:
    """While the engine restarts every rollout fails at once; leasing on at full speed would burn the slots'
    attempts (and the CPU the restart needs). The runner pauses leasing, longer for each failure in a row."""
    requests: list[LeaseRequest] = []
    proxy = proxy_transport()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "proxy":
            return proxy.handler(request)  # type: ignore[no-any-return]
        if request.url.path == "/v1/leases/release":
            return release_answer(request, [])
        if request.url.path == "/v1/leases":
            requests.append(LeaseRequest.model_validate_json(request.content))
            lease = LEASE.model_copy(update={"rollout_id": f"r{len(requests)}", "lease_id": f"l{len(requests)}"})
            return httpx.Response(200, json=LeaseResponse(leases=[lease]).model_dump())
        c = Completion.model_validate_json(request.content)
        return httpx.Response(200, json=CompletionAck(rollout_id=c.rollout_id, status="accepted", scored=False).model_dump())

    r = runner(FakeProvider([SandboxError("engine down")] * 10), httpx.MockTransport(handler), tmp_path)
    r.config.concurrency = 1
    stop = asyncio.Event()
    serving = asyncio.create_task(r.serve(stop))
    await asyncio.sleep(1.5)
    stop.set()
    await asyncio.wait_for(serving, 10)
    assert len(requests) == 1 and r.infra_streak == 1  # the next lease waits 2 s after the first failure
    r.note_outcome(OutcomeKind.wrong)  # a scored rollout ends the backoff
    assert r.infra_streak == 0 and r.lease_after == 0.0
