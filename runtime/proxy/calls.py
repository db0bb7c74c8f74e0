"""The dialect-call path, as plain ASGI (asgi.py says why): route → session → parse → admission → engine call
(engine_call.py: upstream, capture, journal) → the answer in the caller's dialect.

A response (for a stream: its final events) is released only after the call's journal record is durable. Every
error is answered in the caller's dialect; one that is not the caller's or the engine's load is recorded on the
session.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import parse_qsl

from harnessrl.runtime.contracts.proxy import SessionStatus
from harnessrl.runtime.proxy.asgi import Answer, Flusher, StreamAnswer, header, json_answer, read_body
from harnessrl.runtime.proxy.dialects.base import (
    Dialect,
    DialectError,
    Operation,
    ParsedRequest,
    RouteInfo,
    completion_as_chunks,
    reject_constrained_decoding,
)
from harnessrl.runtime.proxy.dialects.routes import dialect_for, match_route, session_key
from harnessrl.runtime.proxy.engine_call import CapturedStream, complete, pick, spliced, with_failover
from harnessrl.runtime.proxy.engines import ContextLengthExceeded, upstream_json
from harnessrl.runtime.proxy.relay import Relayed, relay, relay_address
from harnessrl.runtime.proxy.seeding import call_seed
from harnessrl.runtime.proxy.sessions import Session
from harnessrl.runtime.proxy.state import ProxyState
from harnessrl.runtime.proxy.upstream_http import UpstreamError
from harnessrl.runtime.proxy.workers import FORWARDED_HEADER
from starlette.types import Receive, Scope

log = logging.getLogger("harnessrl.proxy")

PARSE_IN_THREAD_BYTES = 256 * 1024
BUDGET_MESSAGE = "The model call budget for this episode is exhausted. Stop now and report your final answer."
CONTEXT_MESSAGE = "The conversation reached the model's maximum context length. Stop now and report your final answer."


def error_answer(dialect: Dialect, error: DialectError) -> Answer:
    rendered = dialect.render_error(error)
    return json_answer(rendered.body, rendered.status, rendered.headers)


def query_params(scope: Scope) -> dict[str, str]:
    return dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))


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
    return relay_address(key, state.store.owner, state.relay_ports)


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


async def handle_call(state: ProxyState, dialect: Dialect, route: RouteInfo, session: Session, scope: Scope,
                      receive: Receive) -> Answer | StreamAnswer:
    parsed = await _parse(state, dialect, route, session, scope, receive)
    if parsed.operation is Operation.COUNT_TOKENS:
        count = await state.client.count_tokens(pick(state, session), parsed.canonical, state.policy.model)
        return json_answer(dialect.render_count_tokens(count))
    if session.request.training:
        reject_constrained_decoding(parsed.canonical)
    if session.ended or session.budget_left <= 0:
        status = session.status if session.ended else SessionStatus.budget_exhausted
        message = CONTEXT_MESSAGE if status is SessionStatus.context_exhausted else BUDGET_MESSAGE
        return await _final(state, dialect, parsed, session, status, message)
    await _admit(state)
    return await _call_engine(state, dialect, parsed, session)


async def _parse(state: ProxyState, dialect: Dialect, route: RouteInfo, session: Session, scope: Scope,
                 receive: Receive) -> ParsedRequest:
    body = await read_body(scope, receive, state.config.max_body_bytes)
    if len(body) > PARSE_IN_THREAD_BYTES:
        # A long history takes milliseconds to validate; other sessions' streams keep flowing meanwhile.
        return await asyncio.to_thread(dialect.parse_request, body, route, session.history)
    return dialect.parse_request(body, route, session.history)


async def _admit(state: ProxyState) -> None:
    """Refuse a call beyond the replica's in-flight limit; hold one while the engine is paused (weights move)."""
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


async def _call_engine(state: ProxyState, dialect: Dialect, parsed: ParsedRequest,
                       session: Session) -> Answer | StreamAnswer:
    policy = state.policy
    body_json = upstream_json(parsed.canonical, policy.model, session.upstream_messages,
                              training=session.request.training, stream=parsed.stream,
                              max_tokens_cap=state.config.max_tokens_per_call,
                              temperature=state.config.temperature, seed=_seed(state, session))
    # Splicing asks the engine to render the prompt: only where an engine serves that, and the history holds
    # replies of this session.
    splicing = len(session.graph) and state.config.splice and state.pool.renders()
    chain = (session.graph.chain_for(session.reply_keys.keys(parsed.canonical, session.graph.has_chain))
             if splicing else None)
    state.call_started()
    released = False
    try:
        if chain is not None:
            completion = await spliced(state, session, body_json, policy, chain, parsed.canonical.tools)
            if completion is not None:
                state.metrics.count_request(dialect.name, "ok")
                if parsed.stream:
                    return StreamAnswer(dialect.render_stream(completion_as_chunks(completion), parsed))
                return json_answer(dialect.render_response(completion, parsed))
        if parsed.stream:
            engine, upstream = await with_failover(state, session, lambda e: state.client.open_stream(e, body_json))
            released = True  # the stream now owns the in-flight slots
            flusher = Flusher()
            captured = CapturedStream(state, dialect.name, session, engine, upstream, policy, parsed.canonical.tools,
                                      flusher.flush)
            return StreamAnswer(dialect.render_stream(captured.chunks(), parsed), captured.close, flusher)
        completion = await complete(state, session, body_json, policy, parsed.canonical.tools)
        state.metrics.count_request(dialect.name, "ok")
        return json_answer(dialect.render_response(completion, parsed))
    except ContextLengthExceeded as exc:
        return await _final(state, dialect, parsed, session, SessionStatus.context_exhausted, CONTEXT_MESSAGE,
                            error=str(exc))
    finally:
        if not released:
            state.call_ended()


def _seed(state: ProxyState, session: Session) -> int | None:
    """The call's seed in a seeded run: the session's answered calls so far index it, so a call the harness
    retries after an error draws the same seed, here or after a restart (the journal restores the count)."""
    run_seed = state.config.sampling_seed
    return None if run_seed is None else call_seed(run_seed, session.request.rollout_id, session.calls)


async def _final(state: ProxyState, dialect: Dialect, parsed: ParsedRequest, session: Session,
                 status: SessionStatus, message: str, error: str | None = None) -> Answer | StreamAnswer:
    """End the episode gracefully: a plain final message in the caller's dialect, no engine call."""
    await state.durable(session.record_call(status=status, answered=True, error=error))
    state.metrics.count_request(dialect.name, status.value)
    rendered = dialect.render_final(message, parsed)
    if isinstance(rendered, dict):
        return json_answer(rendered)
    return StreamAnswer(rendered)
