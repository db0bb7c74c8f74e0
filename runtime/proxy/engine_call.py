"""One engine call of a session: the engine picked (with failover), its answer captured, the turn journaled.

A whole answer is captured as it is read (`complete`); a stream is forwarded chunk by chunk while captured
(`CapturedStream`), its end held back until the turn is durable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from harnessrl.runtime.contracts.proxy import PolicyState
from harnessrl.runtime.proxy.capture import CallCapture
from harnessrl.runtime.proxy.dialects.base import DialectError, FunctionTool
from harnessrl.runtime.proxy.dialects.upstream import Completion, CompletionChunk
from harnessrl.runtime.proxy.engines import Engine, EngineClient
from harnessrl.runtime.proxy.sessions import Session
from harnessrl.runtime.proxy.splicing import spliced_completion
from harnessrl.runtime.proxy.state import ProxyState
from harnessrl.runtime.proxy.tool_check import ToolMismatch
from harnessrl.runtime.proxy.upstream_http import UpstreamBroken, UpstreamConnectError, UpstreamResponse
from harnessrl.runtime.trajectory.splice import Chain

log = logging.getLogger("harnessrl.proxy")

BROKEN_CONNECTION_RETRIES = 3


def pick(state: ProxyState, session: Session, exclude: frozenset[str] = frozenset()) -> Engine:
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


async def with_failover(state: ProxyState, session: Session, call: Any) -> tuple[Engine, Any]:
    """Run `call(engine)` on the session's engine. If the engine cannot be reached, mark it down and move on to
    the next one; if a kept-alive connection breaks under the request (the engine closed it as we reused it),
    try again, a few times at most. Both are safe because nothing has been sent to the harness yet."""
    tried: set[str] = set()
    broken = 0
    while True:
        engine = pick(state, session, frozenset(tried))
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


def release_engine(state: ProxyState, engine: Engine, started: float) -> None:
    engine.inflight -= 1
    state.metrics.upstream_latency.observe(time.time() - started)


async def record_turn(state: ProxyState, session: Session, capture: CallCapture, policy: PolicyState,
                      started: float, tools: Sequence[FunctionTool] | None) -> None:
    """Journal the captured turn, its tool calls held to the `tools` the call offered (tool_check.py)."""
    turn = capture.to_turn(model=policy.model, policy_version=policy.version, started_at=started,
                           finished_at=time.time())
    mismatch = session.tool_validators.check(tools, capture.called()) if capture.calls else ToolMismatch()
    record = session.record_call(answered=True, turn=turn, prompt_text=capture.prompt_text, after=capture.after,
                                 mismatch=mismatch)
    await state.durable(record)
    state.metrics.count_turn(record["turn"]["trainable"], len(turn.completion_ids))
    if mismatch:
        state.metrics.count_mismatch(session.request.harness, mismatch)
    cause = session.graph.break_cause(record["turn"]["id"])
    if cause is not None:
        state.metrics.prefix_breaks.labels(harness=session.request.harness, cause=cause.value).inc()


async def complete(state: ProxyState, session: Session, body_json: bytes, policy: PolicyState,
                   tools: Sequence[FunctionTool] | None) -> Completion:
    """A whole answer from the session's engine, captured and journaled; the engine's completion."""
    started = time.time()
    capture = CallCapture(known=session.prompt_prefix)
    engine, completion = await with_failover(
        state, session, lambda e: state.client.complete(e, body_json, capture.read_completion)
    )
    release_engine(state, engine, started)
    await record_turn(state, session, capture, policy, started, tools)
    return completion


async def spliced(state: ProxyState, session: Session, body_json: bytes, policy: PolicyState,
                  chain: Chain, tools: Sequence[FunctionTool] | None) -> Completion | None:
    """The call made with the chain's sampled replies spliced into its prompt (splicing.py), captured and
    journaled; None when splicing leaves the prompt as it is (the caller makes the ordinary call)."""
    started = time.time()
    engine, completion = await with_failover(
        state, session, lambda e: spliced_completion(state.client, e, body_json, policy.model, chain)
    )
    if completion is None:  # nothing was sampled (renders only): the ordinary call that follows is the call
        engine.inflight -= 1
        engine.calls -= 1
        return None
    release_engine(state, engine, started)
    state.metrics.spliced.inc()
    await record_turn(state, session, CallCapture.from_completion(completion), policy, started, tools)
    return completion


class CapturedStream:
    """One streamed call: forwards vLLM's chunks to the dialect renderer while capturing them, and owns the
    call's claims: the upstream connection and the engine's in-flight slot (until the engine's stream ends) and
    the proxy's in-flight slot (until the turn is durable). `close` releases whatever is still held, so a
    harness that disconnects before the body starts (the chunk generator then never runs) leaks nothing."""

    def __init__(self, state: ProxyState, dialect_name: str, session: Session, engine: Engine,
                 upstream: UpstreamResponse, policy: PolicyState, tools: Sequence[FunctionTool] | None,
                 before_read: Callable[[], Awaitable[None]]) -> None:
        self.state, self.dialect_name, self.session, self.policy = state, dialect_name, session, policy
        self.tools = tools
        self.engine, self.upstream, self.before_read = engine, upstream, before_read
        self.started = time.time()
        self._holds_engine = True
        self._holds_slot = True

    def _release_upstream(self) -> None:
        if self._holds_engine:
            self._holds_engine = False
            self.upstream.release()
            release_engine(self.state, self.engine, self.started)

    def close(self) -> None:
        self._release_upstream()
        if self._holds_slot:
            self._holds_slot = False
            self.state.call_ended()

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
            await record_turn(state, session, capture, self.policy, self.started, self.tools)
            state.metrics.count_request(self.dialect_name, "ok")
            for chunk in held:
                yield chunk
        except DialectError as exc:
            state.metrics.count_request(self.dialect_name, exc.kind)
            await state.durable(session.record_call(answered=False, error=exc.message))
            raise
        finally:
            self.close()
