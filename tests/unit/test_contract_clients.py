"""The typed clients of runtime/contracts against a real HTTP server on 127.0.0.1: each method sends its route's
method, path, bearer header and body, and reads the reply into the contract's model; refusals reach the callers
(the runner, the learner, `harnessrl eval`) as they expect them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from harnessrl.runtime.contracts.client import bearer
from harnessrl.runtime.contracts.coordinator import (
    AckStatus,
    Completion,
    CompletionAck,
    CoordinatorClient,
    CoordinatorStatus,
    Lease,
    LeaseRelease,
    LeaseReleaseResponse,
    LeaseRenewal,
    LeaseRenewalResponse,
    LeaseRequest,
    LeaseResponse,
    OutcomeKind,
)
from harnessrl.runtime.contracts.learner_config import ProxyLink
from harnessrl.runtime.contracts.proxy import (
    CreateSessionRequest,
    CreateSessionResponse,
    DialectBaseUrls,
    PolicyState,
    ProxyClient,
    SequencesResponse,
    SessionInfo,
    SessionStatus,
)
from harnessrl.runtime.contracts.runner_config import RunnerConfig
from harnessrl.runtime.contracts.status import fetch
from harnessrl.runtime.harness.adapters import adapter_for
from harnessrl.runtime.harness.runner import Runner
from harnessrl.runtime.learner.sync import ProxyControl
from harnessrl.runtime.trajectory.models import TrainingSequence
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from harnessrl.local import evaluate
from tests.fixtures.proxy_server import serve_in_thread
from tests.ports import free_port
from tests.unit.test_runner_outcomes import ALL_TASKS, LEASE, TASKS, FakeProvider

TOKEN = "s3cret"


@dataclass
class Seen:
    method: str
    path: str
    authorization: str | None
    body: Any


@dataclass
class Stub:
    """Answers each (method, path) with its scripted replies in turn (the last one stays), 404 when none."""

    url: str
    replies: dict[tuple[str, str], list[tuple[int, Any]]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def answer(self, method: str, path: str, *replies: tuple[int, Any]) -> None:
        self.replies[(method, path)] = list(replies)

    async def handle(self, request: Request) -> JSONResponse:
        body = await request.body()
        self.seen.append(Seen(request.method, request.url.path, request.headers.get("authorization"),
                              json.loads(body) if body else None))
        queue = self.replies.get((request.method, request.url.path), [(404, {"detail": "no such route"})])
        status, reply = queue.pop(0) if len(queue) > 1 else queue[0]
        return JSONResponse(reply, status_code=status)


@pytest.fixture(scope="module")
def server() -> Iterator[Stub]:
    stub = Stub(url="")
    methods = ["GET", "POST", "PUT", "DELETE"]
    app = Starlette(routes=[Route("/{path:path}", stub.handle, methods=methods)])
    uvicorn_server, thread, stub.url = serve_in_thread(app)
    yield stub
    uvicorn_server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def stub(server: Stub) -> Stub:
    server.replies.clear()
    server.seen.clear()
    return server


def ok(model: Any) -> tuple[int, Any]:
    return 200, model.model_dump(mode="json")


LEASED = Lease(rollout_id="r1", lease_id="l1", task_id="t", harness="h", pool="p", group_id="g", policy_version=2,
               model="tiny-v2", proxy_url="http://proxy:8080", lease_deadline=1e9, training=False)
DONE = Completion(rollout_id="r1", lease_id="l1", runner_id="r", session_id="s1", outcome=OutcomeKind.solved,
                  correctness=1.0, tool_calls=3)
ACK = CompletionAck(rollout_id="r1", status=AckStatus.accepted, scored=True, reward=1.25)
COORDINATOR_CALLS = [
    ("lease", "/v1/leases", LeaseRequest(runner_id="r", pool="p", harness="h", max=2),
     LeaseResponse(leases=[LEASED], renew_every_s=5.0)),
    ("renew", "/v1/leases/renew", LeaseRenewal(runner_id="r", lease_ids=["l1", "l2"]),
     LeaseRenewalResponse(renewed=["l1"])),
    ("release", "/v1/leases/release", LeaseRelease(runner_id="r", pool="p"), LeaseReleaseResponse(released=3)),
    ("complete", "/v1/completions", DONE, ACK),
]


@pytest.mark.parametrize(("method", "path", "request_", "reply"), COORDINATOR_CALLS, ids=[c[0] for c in COORDINATOR_CALLS])
async def test_coordinator_client_posts_the_request_with_the_runner_token_and_reads_the_reply(
    stub: Stub, method: str, path: str, request_: Any, reply: Any
) -> None:
    stub.answer("POST", path, ok(reply))
    async with httpx.AsyncClient(timeout=10) as http:
        got = await getattr(CoordinatorClient(http, stub.url + "/", TOKEN), method)(request_)
    assert got == reply and type(got) is type(reply)
    assert stub.seen == [Seen("POST", path, f"Bearer {TOKEN}", request_.model_dump(mode="json"))]


async def test_coordinator_refusals_raise_httpx_errors_and_an_unknown_rollout_is_none(stub: Stub) -> None:
    stub.answer("POST", "/v1/completions", (404, {"detail": "unknown rollout r1"}))
    stub.answer("POST", "/v1/leases", (401, {"detail": "wrong runner token"}))
    stub.answer("POST", "/v1/leases/renew", (500, {"detail": "boom"}))
    stub.answer("POST", "/v1/leases/release", (200, {"released": -1}))  # not the contract's reply
    async with httpx.AsyncClient(timeout=10) as http:
        client = CoordinatorClient(http, stub.url, TOKEN)
        assert await client.complete(DONE) is None
        with pytest.raises(httpx.HTTPStatusError) as refused:
            await client.lease(LeaseRequest(runner_id="r", pool="p", harness="h"))
        assert refused.value.response.status_code == 401
        with pytest.raises(httpx.HTTPStatusError) as failed:
            await client.renew(LeaseRenewal(runner_id="r", lease_ids=[]))
        assert failed.value.response.status_code == 500
        with pytest.raises(ValueError, match="released"):
            await client.release(LeaseRelease(runner_id="r", pool="p"))
        with pytest.raises(httpx.ConnectError):
            await CoordinatorClient(http, f"http://127.0.0.1:{free_port()}", TOKEN).complete(DONE)


URLS = DialectBaseUrls(openai="http://p/v1", anthropic="http://p", gemini="http://p")
OPEN = CreateSessionRequest(rollout_id="r1", task_id="t", harness="h", group_id="g", call_budget=8, training=False,
                            metadata={"pool": "p"})
OPENED = CreateSessionResponse(session_id="s1", base_url="http://p", replica_id="proxy-0", dialect_base_urls=URLS,
                               model="tiny", policy_version=1, call_budget=8)
INFO = SessionInfo(session_id="s1", rollout_id="r1", task_id="t", harness="h", group_id="g", training=False,
                   metadata={}, status=SessionStatus.active, call_budget=8, calls=2, turns=2, bad_turns=0, tool_calls=1,
                   errors=[], engine_failures=1, policy_versions=[1], created_at=1.0, last_activity_at=2.0)
SEQUENCE = TrainingSequence(session_id="s1", node_ids=[1], token_ids=[5, 6], loss_mask=[0, 1], logprobs=[0.0, -0.5],
                            policy_versions=[1, 1])
POLICY = PolicyState(model="tiny-v3", version=3)
PROXY_CALLS = [
    ("create_session", "POST", "/sessions", OPEN, OPEN.model_dump(mode="json"), OPENED),
    ("session", "GET", "/sessions/s1", "s1", None, INFO),
    ("close_session", "DELETE", "/sessions/s1", "s1", None, INFO.model_copy(update={"status": SessionStatus.closed})),
    ("sequences", "GET", "/sessions/s1/sequences", "s1", None,
     SequencesResponse(session_id="s1", rollout_id="r1", status=SessionStatus.closed, tool_calls=1, sequences=[SEQUENCE])),
    ("put_policy", "PUT", "/policy", POLICY, POLICY.model_dump(), POLICY),
]


@pytest.mark.parametrize(("method", "verb", "path", "arg", "body", "reply"), PROXY_CALLS, ids=[c[0] for c in PROXY_CALLS])
async def test_proxy_client_sends_each_route_with_its_token_and_reads_the_reply(
    stub: Stub, method: str, verb: str, path: str, arg: Any, body: Any, reply: Any
) -> None:
    stub.answer(verb, path, ok(reply))
    async with httpx.AsyncClient(timeout=10) as http:
        got = await getattr(ProxyClient(http, TOKEN), method)(stub.url + "/", arg)
    assert got == reply and type(got) is type(reply)
    assert stub.seen == [Seen(verb, path, f"Bearer {TOKEN}", body)]


async def test_proxy_refusals_raise_httpx_errors(stub: Stub) -> None:
    stub.answer("POST", "/sessions", (403, {"detail": "wrong admin or runner token"}))
    stub.answer("PUT", "/policy", (401, {"detail": "missing admin bearer token"}))
    async with httpx.AsyncClient(timeout=10) as http:
        proxy = ProxyClient(http, TOKEN)
        for call, status in [(proxy.create_session(stub.url, OPEN), 403), (proxy.session(stub.url, "gone"), 404),
                             (proxy.put_policy(stub.url, POLICY), 401)]:
            with pytest.raises(httpx.HTTPStatusError) as refused:
                await call
            assert refused.value.response.status_code == status
        with pytest.raises(httpx.ConnectError):
            await proxy.sequences(f"http://127.0.0.1:{free_port()}", "s1")


def test_status_fetch_reads_the_status_and_gives_none_when_unavailable(stub: Stub) -> None:
    status = CoordinatorStatus(step=4, policy_version=2, open_groups=1, ready_groups=0, leased=3, rollouts_scored=9,
                               rollouts_unscored=1, rollouts_stale=0, groups_skipped_zero_variance=0,
                               policy_model="tiny-v2", done=False)
    stub.answer("GET", "/v1/status", ok(status))
    assert fetch(stub.url) == status and stub.seen[0].authorization is None  # open route: no credential sent
    stub.answer("GET", "/v1/status", (500, {"detail": "starting"}))
    assert fetch(stub.url) is None


# ------------------------------------------------------------------ the callers' terms


async def test_the_runner_maps_refusals_to_outcomes_and_retries_a_failed_completion(stub: Stub, tmp_path: Path) -> None:
    lease = LEASE.model_copy(update={"proxy_url": stub.url})
    stub.answer("POST", "/sessions", (403, {"detail": "wrong admin or runner token"}))
    stub.answer("POST", "/v1/completions", (500, {"detail": "journal full"}), ok(ACK))
    (tmp_path / "runner-token").write_text("runner")
    config = RunnerConfig.model_validate({"runner_token_file": str(tmp_path / "runner-token"), "pool": "p",
                                          "harness": {"name": "qwen-code"}, "tasks": {"kind": "dir", "path": str(TASKS)},
                                          "coordinator_url": stub.url, "infra_retries": 0})
    async with httpx.AsyncClient(timeout=10) as http:
        r = Runner(config, adapter_for(config.harness), FakeProvider([]), ALL_TASKS, http)
        attempt = await r.attempt(lease)
        assert attempt.outcome == OutcomeKind.infra_error
        assert attempt.error == 'proxy refused POST /sessions: HTTP 403 {"detail":"wrong admin or runner token"}'
        assert await r.session_info(stub.url, "gone") is None  # 404: as if the proxy were unreachable
        await r.close("gone", stub.url, lease)  # best effort: a refused close is logged, not raised
        t0 = time.monotonic()
        assert await r.complete(DONE) == ACK  # the 500 is retried after a second
        assert time.monotonic() - t0 >= 1.0
        stub.answer("POST", "/v1/completions", (404, {"detail": "unknown rollout"}))
        assert await r.complete(DONE) is None
    assert {s.authorization for s in stub.seen} == {"Bearer runner"}


async def test_the_learner_names_each_replica_that_refused_the_policy(stub: Stub, tmp_path: Path) -> None:
    (tmp_path / "admin").write_text(TOKEN)
    good, bad = f"{stub.url}/a", f"{stub.url}/b"
    stub.answer("PUT", "/a/policy", ok(POLICY))
    stub.answer("PUT", "/b/policy", (502, {"detail": "not on 1 other worker"}))
    control = ProxyControl(ProxyLink(url=good, replica_urls=[good, bad], admin_token_file=tmp_path / "admin"))
    with pytest.raises(RuntimeError) as failed:
        await control.set_policy(POLICY)
    assert str(failed.value) == ('proxy PUT /policy failed on 1 of 2 replicas: '
                                 f'{bad}: 502 {{"detail":"not on 1 other worker"}}')
    assert [(s.method, s.path, s.authorization, s.body) for s in sorted(stub.seen, key=lambda s: s.path)] == [
        ("PUT", "/a/policy", f"Bearer {TOKEN}", POLICY.model_dump()),
        ("PUT", "/b/policy", f"Bearer {TOKEN}", POLICY.model_dump()),
    ]
    sequences = SequencesResponse(session_id="s1", rollout_id="r1", status=SessionStatus.closed, tool_calls=0,
                                  sequences=[SEQUENCE])
    stub.answer("GET", "/a/sessions/s1/sequences", ok(sequences))
    async with httpx.AsyncClient(timeout=10) as http:
        assert await control.fetcher(http)("s1", None) == [SEQUENCE]
        with pytest.raises(RuntimeError, match=r"^proxy GET /sessions/\{id\}/sequences -> 404: .*no such route"):
            await control.sequences("s2", good, http)


def test_eval_activates_a_checkpoint_at_the_proxy_and_says_when_it_is_refused(stub: Stub) -> None:
    setup: Any = SimpleNamespace(plan=SimpleNamespace(spec=SimpleNamespace(model=SimpleNamespace(served_name="tiny"))),
                                 engine_urls=[], proxy_url=stub.url)
    base = evaluate.Checkpoint(label="base", adapter=None)
    stub.answer("PUT", "/policy", ok(PolicyState(model="tiny", version=0)))
    assert evaluate.activate(setup, base, TOKEN) == PolicyState(model="tiny", version=0)
    assert stub.seen == [Seen("PUT", "/policy", bearer(TOKEN)["Authorization"], {"model": "tiny", "version": 0})]
    stub.answer("PUT", "/policy", (403, {"detail": "wrong admin token"}))
    with pytest.raises(evaluate.EvalRunError,
                       match=r'^the proxy refused the policy tiny: HTTP 403 \{"detail":"wrong admin token"\}$'):
        evaluate.activate(setup, base, TOKEN)
