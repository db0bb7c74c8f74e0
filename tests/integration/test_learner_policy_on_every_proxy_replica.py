"""The learner sets the served policy on every capture proxy replica: two real `harnessrl proxy` processes on
127.0.0.1 sharing one admin token (as a cluster's replicas share its Secret), and the learner's own ProxyControl.

Each replica serves its own sessions with the policy it was last given, so a policy set through a Service (one
replica per request) would leave the others sampling from an older one. No engine is involved: the policy is the
proxy's own state (the upstream URL is never called)."""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest
from harnessrl.runtime.contracts.learner_config import ProxyLink
from harnessrl.runtime.contracts.proxy import PolicyState
from harnessrl.runtime.learner.sync import ProxyControl

from tests.fixtures.proxy_server import ProxyFactory

UNUSED_ENGINE = "http://127.0.0.1:9"  # discard port: nothing here calls the engine


def _served(url: str) -> PolicyState:
    return PolicyState.model_validate(httpx.get(f"{url}/policy", timeout=10).json())


@pytest.mark.timeout(120)
async def test_a_policy_reaches_every_replica_and_a_missing_one_is_named(
    proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text(secrets.token_urlsafe(24))
    replicas = [proxy_factory([UNUSED_ENGINE], admin_token_file=str(token_file)) for _ in range(2)]
    control = ProxyControl(
        ProxyLink(url=replicas[0].url, replica_urls=[r.url for r in replicas], admin_token_file=token_file)
    )

    await control.set_policy(PolicyState(model="tiny-v1", version=1))
    assert [_served(r.url) for r in replicas] == [PolicyState(model="tiny-v1", version=1)] * 2

    # A replica that is down fails the call, by name (the learner retries its publish), and the one that took
    # the policy keeps it; setting it again when both are up is harmless.
    replicas[1].stop()
    with pytest.raises(RuntimeError) as failed:
        await control.set_policy(PolicyState(model="tiny-v2", version=2))
    assert f"failed on 1 of 2 replicas: {replicas[1].url}: ConnectError" in str(failed.value)
    assert token_file.read_text() not in str(failed.value)
    assert _served(replicas[0].url).version == 2
    replicas[1].start()  # back with the journal it had: still at version 1
    assert _served(replicas[1].url).version == 1
    await control.set_policy(PolicyState(model="tiny-v2", version=2))
    assert [_served(r.url).version for r in replicas] == [2, 2]


def test_without_replica_urls_the_policy_goes_to_the_one_proxy_url(tmp_path: Path) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text("t")
    assert ProxyControl(ProxyLink(url="http://p:8080/", admin_token_file=token_file)).replica_urls == ["http://p:8080"]
