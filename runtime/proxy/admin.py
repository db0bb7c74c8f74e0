"""The proxy's admin API, a FastAPI router: sessions, policy, engines, pause/resume (admin token; a session's
creation, state and close also take the runner token), and the open `/healthz` and `/metrics`.

Replica-wide writes (policy, engine drain, pause/resume) that reach one worker of several are applied there and
forwarded to the others (workers.py); a worker that cannot be reached fails the write with 502, naming it.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from harnessrl.runtime.contracts.proxy import (
    CreateSessionRequest,
    CreateSessionResponse,
    DialectBaseUrls,
    PolicyState,
    SequencesResponse,
    SessionStatus,
)
from harnessrl.runtime.proxy.asgi import read_body
from harnessrl.runtime.proxy.dialects.base import DialectError
from harnessrl.runtime.proxy.metrics import merged_exposition
from harnessrl.runtime.proxy.sessions import Session
from harnessrl.runtime.proxy.state import ProxyState, ReplicaFull
from harnessrl.runtime.proxy.workers import FORWARDED_HEADER, Forwarded, forward, sibling_metrics
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter()
ADMIN_BODY_BYTES = 1 << 20  # an admin write or a session's creation


def proxy_state(request: Request) -> ProxyState:
    state: ProxyState = request.app.state.proxy
    return state


def _bearer(request: Request, what: str) -> bytes:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(401, f"missing {what} bearer token")
    return token.strip().encode()


def admin_state(request: Request) -> ProxyState:
    """The proxy's state, for a caller with the admin bearer token (missing: 401, wrong: 403)."""
    state = proxy_state(request)
    if not hmac.compare_digest(_bearer(request, "admin"), state.admin_token.encode()):
        raise HTTPException(403, "wrong admin token")
    return state


def session_state(request: Request) -> ProxyState:
    """The proxy's state, for a caller with the admin or the runner token: the session routes a runner uses."""
    state = proxy_state(request)
    token = _bearer(request, "admin or runner")
    # Both compared, whichever matches: the time taken says nothing about which one was close.
    admin = hmac.compare_digest(token, state.admin_token.encode())
    runner = state.runner_token is not None and hmac.compare_digest(token, state.runner_token.encode())
    if not (admin or runner):
        raise HTTPException(403, "wrong admin or runner token")
    return state


OpenState = Annotated[ProxyState, Depends(proxy_state)]
AdminState = Annotated[ProxyState, Depends(admin_state)]
SessionState = Annotated[ProxyState, Depends(session_state)]


def _session(session_id: str, state: ProxyState) -> Session:
    session = state.store.get(session_id)
    if session is None:
        raise HTTPException(404, "no such session on this replica")
    return session


def owned_session(session_id: str, state: AdminState) -> Session:
    return _session(session_id, state)


def runner_session(session_id: str, state: SessionState) -> Session:
    return _session(session_id, state)


OwnedSession = Annotated[Session, Depends(owned_session)]  # its captures: the admin token only
RunnerSession = Annotated[Session, Depends(runner_session)]  # its state: a runner too


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


async def admin_body(request: Request) -> bytes:
    """An admin write's or a session creation's body, at most ADMIN_BODY_BYTES (a policy, an engine or a session
    request is a few hundred bytes). Read only in a route that took its token's dependency: the token is checked
    before a byte of the body is read."""
    return await read_body(request.scope, request.receive, ADMIN_BODY_BYTES)


def too_large(exc: DialectError) -> JSONResponse:
    """A body over the limit, answered as the admin API answers every error ({"detail": ...}); the connection
    closes, so the rest of the body is never read."""
    return JSONResponse({"detail": exc.message}, status_code=exc.status, headers={"connection": "close"})


# --------------------------------------------------------------------------- open


@router.get("/healthz")
async def healthz(state: OpenState) -> dict[str, Any]:
    return {"status": "ok", "replica_id": state.config.replica_id, "sessions": len(state.store),
            "inflight": state.inflight}


@router.get("/metrics")
async def metrics(request: Request, state: OpenState) -> Response:
    """This worker's metrics; at a worker of several (unless a sibling asks), every worker's, labelled."""
    own = generate_latest(state.metrics.registry)
    if state.role is None or request.headers.get(FORWARDED_HEADER):
        return Response(own, media_type=CONTENT_TYPE_LATEST)
    texts = {state.role.name: own.decode(), **await sibling_metrics(state.role.siblings)}
    return Response(merged_exposition(texts), media_type=CONTENT_TYPE_LATEST)


@router.get("/policy")
async def get_policy(state: OpenState) -> PolicyState:
    return state.policy


# --------------------------------------------------------------------------- sessions


@router.post("/sessions", response_model=CreateSessionResponse)
async def create_session(request: Request, response: Response, state: SessionState) -> Any:
    if state.role is not None:
        # The kernel picks a worker per connection: a runner creating sessions over one kept-alive
        # connection would put them all on one worker, so each creation ends its connection.
        response.headers["connection"] = "close"
    try:
        body = CreateSessionRequest.model_validate_json(await admin_body(request))
    except DialectError as exc:
        return too_large(exc)
    except ValueError as exc:
        return JSONResponse({"detail": f"invalid session request: {exc}"}, status_code=422)
    try:
        session = await state.create_session(body)
    except ReplicaFull:
        return JSONResponse({"detail": "this replica holds its maximum number of sessions"}, status_code=503,
                            headers={"retry-after": str(state.config.admission.retry_after_s)})
    base = state.config.base_url()
    return CreateSessionResponse(
        session_id=session.id,
        base_url=base,
        replica_id=state.config.replica_id,
        dialect_base_urls=DialectBaseUrls(openai=f"{base}/v1", anthropic=base, gemini=base),
        model=state.policy.model,
        policy_version=state.policy.version,
        call_budget=session.call_budget,
    )


@router.get("/sessions/{session_id}")
async def get_session(session: RunnerSession) -> Any:
    return session.info()


@router.get("/sessions/{session_id}/sequences")
async def get_sequences(session: OwnedSession) -> Any:
    return SequencesResponse(
        session_id=session.id,
        rollout_id=session.request.rollout_id,
        status=session.status,
        tool_calls=session.tool_calls,
        sequences=session.sequences().sequences,
    )


@router.get("/sessions/{session_id}/turns")
async def get_turns(session: OwnedSession) -> Any:
    """The session's call graph as captured (nodes with full turns), for debugging and audits."""
    return [node.model_dump(mode="json") for node in session.nodes()]


@router.delete("/sessions/{session_id}")
async def delete_session(session: RunnerSession, state: SessionState) -> Any:
    info = session.info().model_copy(update={"status": SessionStatus.closed})
    await state.end_session(session.id, "closed")
    return info


# --------------------------------------------------------------------------- policy, engines, pause


@router.put("/policy")
async def put_policy(request: Request, state: AdminState) -> Any:
    try:
        body = await admin_body(request)
        policy = PolicyState.model_validate_json(body)
    except DialectError as exc:
        return too_large(exc)
    except ValueError as exc:
        return JSONResponse({"detail": f"invalid policy: {exc}"}, status_code=422)
    await state.set_policy(policy)
    return forward_failed(await forward_to_siblings(state, request, body)) or policy


@router.get("/engines")
async def get_engines(state: AdminState) -> Any:
    now = time.monotonic()
    return [
        {"url": e.url, "draining": e.draining, "healthy": now >= e.unhealthy_until, "inflight": e.inflight,
         "calls": e.calls, "failures": e.failures}
        for e in state.pool.engines
    ]


@router.post("/engines/drain")
async def drain_engine(request: Request, state: AdminState) -> Any:
    """Body {"url": ..., "draining": bool}: a draining engine gets no new calls; in-flight ones finish."""
    try:
        body = await admin_body(request)
    except DialectError as exc:
        return too_large(exc)
    data = json.loads(body)
    engine = state.pool.get(str(data.get("url", "")))
    if engine is None:
        return JSONResponse({"detail": "no such engine"}, status_code=404)
    engine.draining = bool(data.get("draining", True))
    forwarded = await forward_to_siblings(state, request, body)
    inflight = engine.inflight + forwarded.total("inflight")
    return forward_failed(forwarded) or {"url": engine.url, "draining": engine.draining, "inflight": inflight}


@router.post("/admin/pause")
async def pause(request: Request, state: AdminState) -> Any:
    """Hold new engine calls (they wait, up to the read timeout) and wait for in-flight calls to finish,
    so weights can move with no call failing. Returns once nothing is in flight (or after `timeout_s`)."""
    timeout_s = float(request.query_params.get("timeout_s", "60"))
    state.flowing.clear()
    # The other workers pause (and wait for their own in-flight calls) at the same time as this one.
    forwarding = asyncio.ensure_future(forward_to_siblings(state, request, b"", timeout_s + 10.0))
    deadline = time.monotonic() + timeout_s
    while state.inflight and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    forwarded = await forwarding
    return forward_failed(forwarded) or {"paused": True, "inflight": state.inflight + forwarded.total("inflight")}


@router.post("/admin/resume")
async def resume(request: Request, state: AdminState) -> Any:
    state.flowing.set()
    return forward_failed(await forward_to_siblings(state, request, b"")) or {"paused": False}
