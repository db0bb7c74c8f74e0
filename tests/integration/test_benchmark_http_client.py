"""The load generator's calls (the proxy's own HTTP/1.1 client) against the scripted vLLM stand-in (a real uvicorn
server on 127.0.0.1): JSON and streamed answers read whole, keep-alive connections reused, an error status passed
on, and a call past its timeout failing with TimeoutError without its connection going back to the pool."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.fakes.scripted_engine import (
    ByteChatTokenizer,
    ScriptedEngine,
    ScriptedEngineServer,
    ScriptedReply,
    ScriptedToolCall,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "proxy"))

import pytest
from harnessrl.runtime.proxy.upstream_http import Limits, UpstreamPool
from loadgen import post_whole
from workload import SessionWorkload

HEADERS = {"content-type": "application/json"}
TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
CAPTURE = {"logprobs": True, "return_token_ids": True, "stream_options": {"include_usage": True}}


@pytest.fixture
def engine() -> Iterator[ScriptedEngineServer]:
    server = ScriptedEngineServer(ScriptedEngine(ByteChatTokenizer(stride=4))).start()
    server.set_script([ScriptedReply(tool_calls=[ScriptedToolCall(name="shell", arguments={"command": "ls"})])])
    yield server
    server.stop()


def body(stream: bool) -> bytes:
    return json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS, "stream": stream}
        | CAPTURE
    ).encode()


async def test_answers_are_read_whole_over_one_kept_alive_connection(engine: ScriptedEngineServer) -> None:
    client, url = UpstreamPool(Limits()), f"{engine.root_url}/v1/chat/completions"
    try:
        status, raw = await post_whole(client, url, HEADERS, body(False), 10)
        assert status == 200
        answer = json.loads(raw)
        assert answer["prompt_token_ids"] == engine.engine.calls[-1].prompt_ids
        status, raw = await post_whole(client, url, HEADERS, body(True), 10)
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
        [call] = SessionWorkload("openai_chat", True, "k", "tiny").parse_stream(raw).tool_calls
        assert (call.name, json.loads(call.arguments)) == ("shell", {"command": "ls"})
        (origin,) = client._origins.values()
        assert len(origin.open) == 1 and len(origin.idle) == 1  # both calls on one connection
        status, raw = await post_whole(client, url, HEADERS, b"{not json", 10)
        assert status == 400 and b"invalid JSON" in raw
    finally:
        await client.close()


async def test_a_call_past_its_timeout_fails_and_drops_its_connection(engine: ScriptedEngineServer) -> None:
    engine.set_script([ScriptedReply(content="late", delay_s=2.0)])
    client = UpstreamPool(Limits())  # a long read timeout: the call's own timeout is what ends it
    try:
        with pytest.raises(TimeoutError):
            await post_whole(client, f"{engine.root_url}/v1/chat/completions", HEADERS, body(False), 0.3)
        (origin,) = client._origins.values()
        assert not origin.idle and not origin.open
    finally:
        await client.close()
