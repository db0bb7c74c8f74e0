"""Seeded sampling: the seed each call of a seeded run carries (runtime/proxy/seeding.py) and the body it rides in."""

from __future__ import annotations

from harnessrl.runtime.proxy.dialects.base import CanonicalRequest, ChatMessage
from harnessrl.runtime.proxy.engines import upstream_body
from harnessrl.runtime.proxy.seeding import SEED_BITS, call_seed


def _request(**extra: object) -> CanonicalRequest:
    return CanonicalRequest(model="m", messages=[ChatMessage(role="user", content="hi")], **extra)


def test_the_seed_is_a_function_of_run_rollout_and_call_only() -> None:
    seed = call_seed(7, "g000003-r001", 2)
    assert seed == call_seed(7, "g000003-r001", 2)
    assert 0 <= seed < 2**SEED_BITS
    others = {call_seed(8, "g000003-r001", 2), call_seed(7, "g000003-r002", 2), call_seed(7, "g000003-r001", 3),
              call_seed(7, "g000003-r0012", 0)}  # the last: the fields do not run into each other
    assert seed not in others and len(others) == 4


def test_a_training_call_carries_the_runs_seed_in_place_of_the_harnesss() -> None:
    body = upstream_body(_request(seed=123), "tiny", training=True, stream=False, seed=42)
    assert body["seed"] == 42


def test_an_evaluation_call_keeps_the_harnesss_seed_and_gets_the_runs_otherwise() -> None:
    assert upstream_body(_request(seed=123), "tiny", training=False, stream=False, seed=42)["seed"] == 123
    assert upstream_body(_request(), "tiny", training=False, stream=False, seed=42)["seed"] == 42


def test_an_unseeded_run_sends_no_seed_but_the_harnesss() -> None:
    assert "seed" not in upstream_body(_request(), "tiny", training=True, stream=False)
    assert upstream_body(_request(seed=5), "tiny", training=False, stream=False)["seed"] == 5
