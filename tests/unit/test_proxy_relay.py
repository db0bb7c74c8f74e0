"""Which calls a proxy worker relays, and where (runtime/proxy/relay.py): only to another worker of the same proxy."""

from __future__ import annotations

import pytest
from harnessrl.runtime.contracts.proxy import CreateSessionRequest
from harnessrl.runtime.proxy.relay import owner_address, relay_address, relayed_headers, relayed_target
from harnessrl.runtime.proxy.sessions import SessionStore

POD = "run-proxy-1.run-proxy.team.svc:8082"
TOKEN = "A" * 32
PORTS = frozenset({8080, 8081, 8082, 9000, 9001})  # the replica's port and its workers' (workers.py proxy_ports)


def test_a_session_id_ends_with_the_address_of_the_worker_that_made_it() -> None:
    assert owner_address("http://Run-Proxy-1.run-proxy.team.svc:8082") == POD
    store = SessionStore(default_budget=5, ttl_s=60, owner=POD)
    session, _ = store.create(CreateSessionRequest(rollout_id="r", task_id="t", harness="h", group_id="g"))
    token, dot, owner = session.id.partition(".")
    assert (dot, owner, len(token)) == (".", POD, 32)
    assert relay_address(session.id, POD, PORTS) is None  # its own


@pytest.mark.parametrize(
    ("owner", "own", "expected"),
    [
        ("run-proxy-1.run-proxy.team.svc:8081", POD, "run-proxy-1.run-proxy.team.svc:8081"),  # a sibling worker
        ("run-proxy-0.run-proxy.team.svc:8080", POD, "run-proxy-0.run-proxy.team.svc:8080"),  # another replica
        ("127.0.0.1:9001", "127.0.0.1:9000", "127.0.0.1:9001"),  # one host (local runs, tests)
        ("evil.example.com:443", POD, None),  # another domain
        ("x.run-proxy.other.svc:8080", POD, None),
        ("a.b.run-proxy.team.svc:8080", POD, None),  # not one label in the replica's domain
        ("-bad-.run-proxy.team.svc:8080", POD, None),
        ("run-proxy-0.run-proxy.team.svc:0", POD, None),  # no such port
        ("run-proxy-0.run-proxy.team.svc:99999", POD, None),
        ("run-proxy-0.run-proxy.team.svc", POD, None),  # no port
        ("10.0.0.1:9000", "127.0.0.1:9000", None),  # an IP host relays only to itself
        ("1.0.0.1:9000", "127.0.0.1:9000", None),  # same "domain" as text, but IPs have none
        ("[::1]:9001", "[::1]:9000", "[::1]:9001"),
        # A port that is not the proxy's: another service on the proxy's host, or on a replica's.
        ("127.0.0.1:22", "127.0.0.1:9000", None),
        ("127.0.0.1:8090", "127.0.0.1:9000", None),
        ("run-proxy-0.run-proxy.team.svc:8090", POD, None),
    ],
)
def test_only_other_workers_of_this_proxy_are_relayed_to(owner: str, own: str, expected: str | None) -> None:
    assert relay_address(f"{TOKEN}.{owner}", own, PORTS) == expected


def test_ids_without_an_owner_are_not_relayed() -> None:
    assert relay_address(TOKEN, POD, PORTS) is None  # sessions made before ids named their owner
    assert relay_address("", POD, PORTS) is None


def test_the_relayed_call_keeps_its_path_query_and_headers_but_not_the_hop_by_hop_ones() -> None:
    scope = {
        "method": "POST", "path": "/v1beta/models/m:streamGenerateContent", "query_string": b"alt=sse",
        "raw_path": b"/v1beta/models/m:streamGenerateContent",
        "headers": [(b"host", b"public.example"), (b"content-length", b"12"), (b"connection", b"keep-alive"),
                    (b"x-goog-api-key", b"k"), (b"content-type", b"application/json")],
    }
    assert relayed_target(scope) == "/v1beta/models/m:streamGenerateContent?alt=sse"
    assert relayed_headers(scope) == {"x-goog-api-key": "k", "content-type": "application/json",
                                      "x-harnessrl-forwarded": "1"}
