"""The capture proxy's FastAPI app: admin/control routes and the four dialect surfaces.

The handlers are thin: auth, body limits and admission here; parsing and rendering in dialects/; what the
engine gets in engines.py; what is recorded in capture.py and sessions.py; durability in journal.py.
A response (for a stream: its final events) is released only after the call's journal record is durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from harnessrl.runtime.contracts.proxy import (
    CreateSessionRequest,
    CreateSessionResponse,
    DialectBaseUrls,
    PolicyState,
    SequencesResponse,
    SessionStatus,
)
from harnessrl.runtime.proxy.asgi import Answer, Flusher, StreamAnswer, header, json_answer, read_body
from harnessrl.runtime.proxy.capture import CallCapture
from harnessrl.runtime.proxy.config import ProxyConfig
from harnessrl.runtime.proxy.dialects.base import (
    Dialect,
    DialectError,
    Operation,
    ParsedRequest,
    RouteInfo,
    reject_constrained_decoding,
)
from harnessrl.runtime.proxy.dialects.routes import dialect_for, dialect_for_path, match_route, session_key
from harnessrl.runtime.proxy.dialects.upstream import CompletionChunk
from harnessrl.runtime.proxy.engines import (
    ContextLengthExceeded,
    Engine,
    EngineClient,
    EnginePool,
    make_client,
    upstream_json,
)
from harnessrl.runtime.proxy.gc_policy import COLLECTOR
from harnessrl.runtime.proxy.heap_trim import TRIMMER
from harnessrl.runtime.proxy.journal import Journal, read_records
from harnessrl.runtime.proxy.metrics import ProxyMetrics, merged_exposition
from harnessrl.runtime.proxy.relay import Relayed, owner_address, relay, relay_address
from harnessrl.runtime.proxy.sessions import Session, SessionStore
from harnessrl.runtime.proxy.upstream_http import (
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
)
from harnessrl.runtime.proxy.workers import FORWARDED_HEADER, Forwarded, WorkerRole, forward, sibling_metrics
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import Receive, Scope, Send

log = logging.getLogger("harnessrl.proxy")

PARSE_IN_THREAD_BYTES = 256 * 1024
BROKEN_CONNECTION_RETRIES = 3
BUDGET_MESSAGE = "The model call budget for this episode is exhausted. Stop now and report your final answer."
CONTEXT_MESSAGE = "The conversation reached the model's maximum context length. Stop now and report your final answer."


class AdminAuthError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        self.status = status
        self.detail = detail


@dataclass
class ProxyState:
    config: ProxyConfig
    admin_token: str
    store: SessionStore
    journal: Journal
    pool: EnginePool
    http: UpstreamPool
    client: EngineClient
    metrics: ProxyMetrics
    inflight: int = 0
    # Set = calls flow; cleared by POST /admin/pause while weights move (new calls wait, in-flight ones finish).
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    ended_since_compaction: int = 0
    # Which worker of its replica this is, when it is one of several (workers.py): replica-wide admin writes
    # are forwarded to the others, and /metrics gathers theirs.
    role: WorkerRole | None = None

    @property
    def policy(self) -> PolicyState:
        assert self.store.policy is not None
        return self.store.policy

    async def durable(self, record: dict[str, Any]) -> None:
        started = time.perf_counter()
        await self.journal.append(record)
        self.metrics.journal_latency.observe(time.perf_counter() - started)


def build_state(config: ProxyConfig, role: WorkerRole | None) -> ProxyState:
    """Open the journal, rebuild this replica's sessions from it, and compact it (synchronous, at startup)."""
    store = SessionStore(default_budget=config.call_budget_default, ttl_s=config.session_ttl_s,
                         owner=owner_address(config.base_url()))
    path = config.journal_dir / f"{config.replica_id}.jsonl"
    for record in read_records(path):
        store.replay(record)
    now = time.time()
    for sid in store.expired(now):
        store.end(sid, "expired")
    if store.policy is None:
        store.policy = PolicyState(model=config.served_model, version=config.policy_version)
    journal = Journal(path, fsync=config.journal_fsync)
    http = make_client(config.upstream)
    metrics = ProxyMetrics()
    metrics.sessions_live.set(len(store))
    metrics.policy_version.set(store.policy.version)
    state = ProxyState(
        config=config,
        admin_token=config.read_admin_token(),
        store=store,
        journal=journal,
        pool=EnginePool.from_urls([str(u) for u in config.upstream_urls]),
        http=http,
        client=EngineClient(http, config.admission.retry_after_s),
        metrics=metrics,
        role=role,
    )
    state.flowing.set()
    journal.hold_commits(config.journal_commit_delay_s, lambda: state.inflight)
    return state


# --------------------------------------------------------------------------- helpers


def require_admin(state: ProxyState, request: Request) -> None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AdminAuthError(401, "missing admin bearer token")
    if not hmac.compare_digest(token.strip().encode(), state.admin_token.encode()):
        raise AdminAuthError(403, "wrong admin token")


def error_answer(dialect: Dialect, error: DialectError) -> Answer:
    rendered = dialect.render_error(error)
    return json_answer(rendered.body, rendered.status, rendered.headers)


def call_key(scope: Scope) -> str | None:
    """The API key a call carries (its session id), or None."""
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    return session_key(headers, query_params(scope))


def session_for(state: ProxyState, key: str | None) -> Session:
    if key is None:
        raise DialectError("missing API key: send the session id as the API key", "authentication")
    session = state.store.get(key)
    if session is None:
        raise DialectError("invalid API key: no such session on this proxy", "authentication")
    return session


def query_params(scope: Scope) -> dict[str, str]:
    return dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))


def dialect_urls(base: str) -> DialectBaseUrls:
    return DialectBaseUrls(openai=f"{base}/v1", anthropic=base, gemini=base)


# --------------------------------------------------------------------------- the app


async def forward_to_siblings(state: ProxyState, request: Request, body: bytes, timeout_s: float = 60.0) -> Forwarded:
    """A replica-wide write this worker has applied, sent on to the replica's other workers (none: no-op)."""
    if state.role is None or request.headers.get(FORWARDED_HEADER):
        return Forwarded([], [])
    path_qs = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return await forward(state.role.siblings, request.method, path_qs, body, request.headers["authorization"],
                         timeout_s)


def forward_failed(forwarded: Forwarded) -> JSONResponse | None:
    if not forwarded.failures:
        return None
    return JSONResponse({"detail": f"applied here, but not on {len(forwarded.failures)} other worker(s) of this "
                         "replica (retry): " + "; ".join(forwarded.failures)}, status_code=502)


def create_app(config: ProxyConfig, role: WorkerRole | None = None) -> ProxyApp:
    """The proxy for `config`; `role`: which worker of its replica it is, when it is one of several."""
    holder: dict[str, ProxyState] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = build_state(config, role)
        holder["state"] = state
        app.state.proxy = state
        await state.journal.compact(state.store.keeps)
        gc.freeze()  # what startup built (modules, rebuilt sessions) lives on: keep it out of every collection
        background = [asyncio.create_task(_sweep(state)), asyncio.create_task(TRIMMER.run())]
        if role is not None and role.heartbeat is not None:
            role.heartbeat.start()  # from here on the supervisor expects a beat every interval
        log.info("proxy %s up: %d sessions rebuilt, engines %s", config.replica_id, len(state.store),
                 [e.url for e in state.pool.engines])
        try:
            yield
        finally:
            if role is not None and role.heartbeat is not None:
                role.heartbeat.stop()
            for task in background:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await state.http.close()
            state.journal.close()

    app = FastAPI(title="harnessrl capture proxy", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def st() -> ProxyState:
        return holder["state"]

    @app.exception_handler(AdminAuthError)
    async def _admin_auth(_: Request, exc: AdminAuthError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        state = st()
        return {"status": "ok", "replica_id": config.replica_id, "sessions": len(state.store), "inflight": state.inflight}

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        """This worker's metrics; at a worker of several (unless a sibling asks), every worker's, labelled."""
        state = st()
        own = generate_latest(state.metrics.registry)
        if state.role is None or request.headers.get(FORWARDED_HEADER):
            return Response(own, media_type=CONTENT_TYPE_LATEST)
        texts = {state.role.name: own.decode(), **await sibling_metrics(state.role.siblings)}
        return Response(merged_exposition(texts), media_type=CONTENT_TYPE_LATEST)

    # ---- admin: sessions

    @app.post("/sessions", response_model=CreateSessionResponse)
    async def create_session(request: Request, response: Response) -> Any:
        state = st()
        require_admin(state, request)
        if state.role is not None:
            # The kernel picks a worker per connection: a runner creating sessions over one kept-alive
            # connection would put them all on one worker, so each creation ends its connection.
            response.headers["connection"] = "close"
        try:
            body = CreateSessionRequest.model_validate_json(await read_body(request.scope, request.receive, 1 << 20))
        except DialectError as exc:
            return JSONResponse({"detail": exc.message}, status_code=exc.status)
        except ValueError as exc:
            return JSONResponse({"detail": f"invalid session request: {exc}"}, status_code=422)
        if len(state.store) >= config.admission.max_sessions:
            return JSONResponse({"detail": "this replica holds its maximum number of sessions"}, status_code=503,
                                headers={"retry-after": str(config.admission.retry_after_s)})
        session, record = state.store.create(body)
        await state.durable(record)
        state.metrics.sessions_created.inc()
        state.metrics.sessions_live.set(len(state.store))
        base = config.base_url()
        return CreateSessionResponse(
            session_id=session.id,
            base_url=base,
            replica_id=config.replica_id,
            dialect_base_urls=dialect_urls(base),
            model=state.policy.model,
            policy_version=state.policy.version,
            call_budget=session.call_budget,
        )

    def admin_session(request: Request, session_id: str) -> Session | JSONResponse:
        state = st()
        require_admin(state, request)
        session = state.store.get(session_id)
        if session is None:
            return JSONResponse({"detail": "no such session on this replica"}, status_code=404)
        return session

    @app.get("/sessions/{session_id}")
    async def get_session(session_id: str, request: Request) -> Any:
        session = admin_session(request, session_id)
        return session if isinstance(session, JSONResponse) else session.info()

    @app.get("/sessions/{session_id}/sequences")
    async def get_sequences(session_id: str, request: Request) -> Any:
        session = admin_session(request, session_id)
        if isinstance(session, JSONResponse):
            return session
        seqs = session.sequences()
        return SequencesResponse(
            session_id=session.id,
            rollout_id=session.request.rollout_id,
            status=session.status,
            tool_calls=session.tool_calls,
            sequences=seqs.sequences,
        )

    @app.get("/sessions/{session_id}/turns")
    async def get_turns(session_id: str, request: Request) -> Any:
        """The session's call graph as captured (nodes with full turns), for debugging and audits."""
        session = admin_session(request, session_id)
        if isinstance(session, JSONResponse):
            return session
        return [node.model_dump(mode="json") for node in session.nodes()]

    @app.delete("/sessions/{session_id}")
    async def delete_session(session_id: str, request: Request) -> Any:
        state = st()
        session = admin_session(request, session_id)
        if isinstance(session, JSONResponse):
            return session
        info = session.info().model_copy(update={"status": SessionStatus.closed})
        _, record = state.store.end(session_id, "closed")
        await state.durable(record)
        state.ended_since_compaction += 1
        state.metrics.sessions_ended.labels("closed").inc()
        state.metrics.sessions_live.set(len(state.store))
        return info

    # ---- admin: policy, engines, pause

    @app.get("/policy")
    async def get_policy() -> PolicyState:
        return st().policy

    @app.put("/policy")
    async def put_policy(request: Request) -> Any:
        state = st()
        require_admin(state, request)
        body = await request.body()
        try:
            policy = PolicyState.model_validate_json(body)
        except ValueError as exc:
            return JSONResponse({"detail": f"invalid policy: {exc}"}, status_code=422)
        await state.durable(state.store.set_policy(policy))
        state.metrics.policy_version.set(policy.version)
        return forward_failed(await forward_to_siblings(state, request, body)) or policy

    @app.get("/engines")
    async def get_engines(request: Request) -> Any:
        state = st()
        require_admin(state, request)
        now = time.monotonic()
        return [
            {"url": e.url, "draining": e.draining, "healthy": now >= e.unhealthy_until, "inflight": e.inflight,
             "calls": e.calls, "failures": e.failures}
            for e in state.pool.engines
        ]

    @app.post("/engines/drain")
    async def drain_engine(request: Request) -> Any:
        """Body {"url": ..., "draining": bool}: a draining engine gets no new calls; in-flight ones finish."""
        state = st()
        require_admin(state, request)
        body = await request.body()
        data = json.loads(body)
        engine = state.pool.get(str(data.get("url", "")))
        if engine is None:
            return JSONResponse({"detail": "no such engine"}, status_code=404)
        engine.draining = bool(data.get("draining", True))
        forwarded = await forward_to_siblings(state, request, body)
        inflight = engine.inflight + forwarded.total("inflight")
        return forward_failed(forwarded) or {"url": engine.url, "draining": engine.draining, "inflight": inflight}

    @app.post("/admin/pause")
    async def pause(request: Request) -> Any:
        """Hold new engine calls (they wait, up to the read timeout) and wait for in-flight calls to finish,
        so weights can move with no call failing. Returns once nothing is in flight (or after `timeout_s`)."""
        state = st()
        require_admin(state, request)
        timeout_s = float(request.query_params.get("timeout_s", "60"))
        state.flowing.clear()
        # The other workers pause (and wait for their own in-flight calls) at the same time as this one.
        forwarding = asyncio.ensure_future(forward_to_siblings(state, request, b"", timeout_s + 10.0))
        deadline = time.monotonic() + timeout_s
        while state.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        forwarded = await forwarding
        return forward_failed(forwarded) or {"paused": True, "inflight": state.inflight + forwarded.total("inflight")}

    @app.post("/admin/resume")
    async def resume(request: Request) -> Any:
        state = st()
        require_admin(state, request)
        state.flowing.set()
        return forward_failed(await forward_to_siblings(state, request, b"")) or {"paused": False}

    # ---- dialect surfaces

    @app.get("/{path:path}")
    async def get_any(path: str, request: Request) -> Any:
        if path.endswith("v1/models") or path == "v1/models":
            return models_list(st().policy.model)
        answer = error_answer(dialect_for_path("/" + path), DialectError(f"no route GET /{path}", "not_found"))
        return Response(answer.body, answer.status, answer.headers, media_type="application/json")

    return ProxyApp(app)


class ProxyApp:
    """The proxy's ASGI app. Dialect calls are served by plain ASGI functions (asgi.py says why); everything else
    goes to the admin FastAPI app, which also runs the lifespan and holds the state (`admin.state.proxy`)."""

    def __init__(self, admin: FastAPI) -> None:
        self.admin = admin
        # The admin API's POST paths, as its routes declare them; a POST to any other path is a dialect call.
        self.admin_posts = frozenset(r.path for r in admin.routes if isinstance(r, APIRoute) and "POST" in r.methods)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] not in self.admin_posts:
            answer = await dialect_call(self.admin.state.proxy, scope, receive)
            await answer.send(send, receive)
        else:
            await self.admin(scope, receive, send)


async def dialect_call(state: ProxyState, scope: Scope, receive: Receive) -> Answer | StreamAnswer | Relayed:
    path = scope["path"]
    route = match_route(path, query_params(scope))
    dialect = dialect_for(route)
    if route is None:
        return error_answer(dialect, DialectError(f"no dialect serves POST {path}", "not_found"))
    key = call_key(scope)
    try:
        session = session_for(state, key)
    except DialectError as exc:
        address = _relay_address(state, scope, key)
        if address is not None:
            return await _relay(state, dialect, address, scope, receive)
        state.metrics.count_request(dialect.name, "unauthorized")
        return error_answer(dialect, exc)
    try:
        return await handle_call(state, dialect, route, session, scope, receive)
    except DialectError as exc:
        error = exc
    except Exception as exc:  # a bug, or an error no layer classified: still answer in the dialect
        log.exception("unexpected error in a %s call", dialect.name)
        error = DialectError(f"internal proxy error: {type(exc).__name__}", "internal")
    state.metrics.count_request(dialect.name, error.kind)
    if error.kind not in ("overloaded", "rate_limit"):
        await state.durable(session.record_call(answered=False, error=error.message))
    return error_answer(dialect, error)


def _relay_address(state: ProxyState, scope: Scope, key: str | None) -> str | None:
    """The owner of the session `key` names when another worker of this proxy holds it (relay.py); None for a
    call that was relayed already."""
    if key is None or header(scope, FORWARDED_HEADER.encode()) is not None:
        return None
    return relay_address(key, state.store.owner)


async def _relay(state: ProxyState, dialect: Dialect, address: str, scope: Scope,
                 receive: Receive) -> Answer | Relayed:
    try:
        body = await read_body(scope, receive, state.config.max_body_bytes)
        relayed = await relay(state.http, address, scope, body)
    except DialectError as exc:
        error = exc
    except (UpstreamError, TimeoutError) as exc:
        error = DialectError(f"the proxy worker that holds this session ({address}) is unreachable: "
                             f"{type(exc).__name__}; retry", "overloaded",
                             retry_after=state.config.admission.retry_after_s)
    else:
        state.metrics.count_request(dialect.name, "relayed")
        return relayed
    state.metrics.count_request(dialect.name, error.kind)
    return error_answer(dialect, error)


def models_list(model: str) -> dict[str, Any]:
    """One model, in a shape both the OpenAI and the Anthropic SDKs read."""
    entry = {"id": model, "object": "model", "created": 0, "owned_by": "harnessrl", "type": "model",
             "display_name": model, "created_at": "1970-01-01T00:00:00Z"}
    return {"object": "list", "data": [entry], "has_more": False, "first_id": model, "last_id": model}


async def _sweep(state: ProxyState) -> None:
    """Expire sessions idle past the TTL; compact the journal once enough sessions have ended; when one is due,
    a full garbage collection (gc_policy.py)."""
    interval = min(60.0, max(0.5, state.config.session_ttl_s / 10))
    while True:
        await asyncio.sleep(interval)
        for sid in state.store.expired(time.time()):
            _, record = state.store.end(sid, "expired")
            await state.durable(record)
            state.ended_since_compaction += 1
            state.metrics.sessions_ended.labels("expired").inc()
        state.metrics.sessions_live.set(len(state.store))
        if state.ended_since_compaction >= max(100, len(state.store)):
            state.ended_since_compaction = 0
            await state.journal.compact(state.store.keeps)
        COLLECTOR.collect_if_due()


# --------------------------------------------------------------------------- one dialect call


async def handle_call(state: ProxyState, dialect: Dialect, route: RouteInfo, session: Session, scope: Scope,
                      receive: Receive) -> Answer | StreamAnswer:
    body = await read_body(scope, receive, state.config.max_body_bytes)
    if len(body) > PARSE_IN_THREAD_BYTES:
        # A long history takes milliseconds to validate; other sessions' streams keep flowing meanwhile.
        parsed = await asyncio.to_thread(dialect.parse_request, body, route, session.history)
    else:
        parsed = dialect.parse_request(body, route, session.history)
    if parsed.operation is Operation.COUNT_TOKENS:
        engine = _pick(state, session)
        count = await state.client.count_tokens(engine, parsed.canonical, state.policy.model)
        return json_answer(dialect.render_count_tokens(count))
    if session.request.training:
        reject_constrained_decoding(parsed.canonical)
    if session.ended or session.budget_left <= 0:
        status = session.status if session.ended else SessionStatus.budget_exhausted
        message = CONTEXT_MESSAGE if status is SessionStatus.context_exhausted else BUDGET_MESSAGE
        return await _final(state, dialect, parsed, session, status, message)
    if state.inflight >= state.config.admission.max_inflight_calls:
        state.metrics.rejected.inc()
        raise DialectError("the proxy is at its concurrency limit; retry shortly", "overloaded",
                           retry_after=state.config.admission.retry_after_s)
    if not state.flowing.is_set():
        try:
            await asyncio.wait_for(state.flowing.wait(), timeout=state.config.upstream.read_timeout_s)
        except TimeoutError:
            raise DialectError("the engine is paused for a weight update", "overloaded",
                               retry_after=state.config.admission.retry_after_s) from None
    policy = state.policy
    body_json = upstream_json(
        parsed.canonical,
        policy.model,
        session.upstream_messages,
        training=session.request.training,
        stream=parsed.stream,
        max_tokens_cap=state.config.max_tokens_per_call,
    )
    state.inflight += 1
    state.metrics.inflight.inc()
    released = False
    try:
        try:
            if parsed.stream:
                engine, upstream = await _with_failover(state, session, lambda e: state.client.open_stream(e, body_json))
                released = True  # the stream now owns the in-flight slots
                flusher = Flusher()
                captured = CapturedStream(state, dialect.name, session, engine, upstream, policy, flusher.flush)
                return StreamAnswer(dialect.render_stream(captured.chunks(), parsed), captured.close, flusher)
            started = time.time()
            capture = CallCapture(known=session.prompt_prefix)
            engine, completion = await _with_failover(
                state, session, lambda e: state.client.complete(e, body_json, capture.read_completion)
            )
            _release_engine(state, engine, started)
        except ContextLengthExceeded as exc:
            return await _final(state, dialect, parsed, session, SessionStatus.context_exhausted, CONTEXT_MESSAGE,
                                error=str(exc))
        await _record_turn(state, session, capture, policy, started)
        state.metrics.count_request(dialect.name, "ok")
        return json_answer(dialect.render_response(completion, parsed))
    finally:
        if not released:
            state.inflight -= 1
            state.metrics.inflight.dec()


def _pick(state: ProxyState, session: Session, exclude: frozenset[str] = frozenset()) -> Engine:
    """The session's engine, or an overloaded error (with Retry-After) when none is up or it is saturated: the
    harness retries later instead of the proxy queueing without bound."""
    retry_after = state.config.admission.retry_after_s
    engine = state.pool.pick(session.id, exclude)
    if engine is None:
        session.engine_failures += 1
        raise DialectError("no engine is available", "overloaded", retry_after=retry_after)
    if engine.inflight >= state.config.admission.max_inflight_per_engine:
        state.metrics.rejected.inc()
        raise DialectError("the engine is at its concurrency limit; retry shortly", "overloaded",
                           retry_after=retry_after)
    return engine


async def _with_failover(state: ProxyState, session: Session, call: Any) -> tuple[Engine, Any]:
    """Run `call(engine)` on the session's engine. If the engine cannot be reached, mark it down and move on to
    the next one; if a kept-alive connection breaks under the request (the engine closed it as we reused it),
    try again, a few times at most. Both are safe because nothing has been sent to the harness yet."""
    tried: set[str] = set()
    broken = 0
    while True:
        engine = _pick(state, session, frozenset(tried))
        engine.inflight += 1
        engine.calls += 1
        answered = False
        try:
            result = await call(engine)
            answered = True  # the caller now owns the engine's in-flight slot
            return engine, result
        except TimeoutError:
            raise DialectError("the engine did not answer in time", "timeout") from None
        except UpstreamConnectError as exc:
            state.pool.mark_down(engine)
            state.metrics.engine_failures.labels(engine.url).inc()
            log.warning("engine %s unreachable (%s); trying another", engine.url, type(exc).__name__)
            tried.add(engine.url)
        except UpstreamBroken as exc:
            # A kept-alive connection the engine closed as we reused it, or an answer that broke off: not a sign
            # the engine is down, so it is not marked down; the next try takes another connection, or opens one.
            broken += 1
            if broken > BROKEN_CONNECTION_RETRIES:
                raise DialectError(f"the engine connection broke: {type(exc).__name__}", "upstream") from None
        except DialectError as exc:
            if exc.kind == "overloaded":  # busy, or restarted and not serving the policy yet
                session.engine_failures += 1
            raise
        finally:
            if not answered:
                engine.inflight -= 1


def _release_engine(state: ProxyState, engine: Engine, started: float) -> None:
    engine.inflight -= 1
    state.metrics.upstream_latency.observe(time.time() - started)


async def _record_turn(state: ProxyState, session: Session, capture: CallCapture, policy: PolicyState,
                       started: float) -> None:
    turn = capture.to_turn(model=policy.model, policy_version=policy.version, started_at=started,
                           finished_at=time.time())
    record = session.record_call(answered=True, turn=turn, prompt_text=capture.prompt_text, after=capture.after)
    await state.durable(record)
    state.metrics.count_turn(record["turn"]["trainable"], len(turn.completion_ids))


async def _final(state: ProxyState, dialect: Dialect, parsed: ParsedRequest, session: Session,
                 status: SessionStatus, message: str, error: str | None = None) -> Answer | StreamAnswer:
    """End the episode gracefully: a plain final message in the caller's dialect, no engine call."""
    await state.durable(session.record_call(status=status, answered=True, error=error))
    state.metrics.count_request(dialect.name, status.value)
    rendered = dialect.render_final(message, parsed)
    if isinstance(rendered, dict):
        return json_answer(rendered)
    return StreamAnswer(rendered)


class CapturedStream:
    """One streamed call: forwards vLLM's chunks to the dialect renderer while capturing them, and owns the
    call's claims: the upstream connection and the engine's in-flight slot (until the engine's stream ends) and
    the proxy's in-flight slot (until the turn is durable). `close` releases whatever is still held, so a
    harness that disconnects before the body starts (the chunk generator then never runs) leaks nothing."""

    def __init__(self, state: ProxyState, dialect_name: str, session: Session, engine: Engine,
                 upstream: UpstreamResponse, policy: PolicyState,
                 before_read: Callable[[], Awaitable[None]]) -> None:
        self.state, self.dialect_name, self.session, self.policy = state, dialect_name, session, policy
        self.engine, self.upstream, self.before_read = engine, upstream, before_read
        self.started = time.time()
        self._holds_engine = True
        self._holds_slot = True

    def _release_upstream(self) -> None:
        if self._holds_engine:
            self._holds_engine = False
            self.upstream.release()
            _release_engine(self.state, self.engine, self.started)

    def close(self) -> None:
        self._release_upstream()
        if self._holds_slot:
            self._holds_slot = False
            self.state.inflight -= 1
            self.state.metrics.inflight.dec()

    async def chunks(self) -> AsyncIterator[CompletionChunk]:
        """The chunks from the finish reason on are held back until the turn is durable, so the harness never
        sees the end of a response that was not journaled. A broken stream is recorded as a session error and
        ends in the dialect's in-stream error. `before_read` sends what was rendered so far, before waiting on
        the engine again."""
        state, session = self.state, self.session
        capture = CallCapture(known=session.prompt_prefix)
        held: list[CompletionChunk] = []
        try:
            try:
                async for chunk in EngineClient.chunks(self.upstream, self.before_read, capture.read_chunk):
                    if held or capture.finish_reason is not None or not chunk.get("choices"):
                        held.append(chunk)
                    else:
                        yield chunk
            except (UpstreamBroken, TimeoutError) as exc:
                session.engine_failures += 1
                raise DialectError(f"the engine stream broke: {type(exc).__name__}", "upstream") from None
            finally:
                self._release_upstream()
            await _record_turn(state, session, capture, self.policy, self.started)
            state.metrics.count_request(self.dialect_name, "ok")
            for chunk in held:
                yield chunk
        except DialectError as exc:
            state.metrics.count_request(self.dialect_name, exc.kind)
            await state.durable(session.record_call(answered=False, error=exc.message))
            raise
        finally:
            self.close()
