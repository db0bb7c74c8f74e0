"""A call that reaches a worker other than its session's owner is relayed to the owner.

Kept for correctness, not speed: without it such a call would get a 401; a call at its owner never reaches it.

A session lives on the worker that created it, and its id (the harness's API key) ends with that worker's address,
`<random>.<host>:<port>` (the host and port of its `base_url`). A harness normally calls the owner at the session's
`base_url`. One that cannot reaches some other worker: an E2B sandbox, say, reaches the proxy through one public URL,
which lands on any replica and, there, on any worker. That worker relays the call to the owner as it is (method,
path, headers, body) and the owner's answer back as it comes (status, headers, body, a stream chunk by chunk), so
the owner parses, captures and journals it exactly as if it had come straight.

Only addresses of this proxy are relayed to: a port of the proxy's own (workers.py `proxy_ports`: the replica's
port and its workers' ports, the same on every replica, plus `ProxyConfig.relay_ports`) on the worker's own host (its sibling
workers) or, when that host is a DNS name, on a host in the same domain (the run's other replicas,
`<pod>.<headless service>.<namespace>.svc`). So a forged key cannot make the proxy call anywhere else: not
another host, and not another service listening on the proxy's own host or loopback (a harness in a sandbox
whose only way out is the proxy would otherwise reach the coordinator or anything else bound to 127.0.0.1). A relayed call carries `x-harnessrl-forwarded` and is never
relayed again (a session the owner does not hold, say one that expired, gets the owner's 401).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from harnessrl.runtime.proxy.upstream_http import UpstreamPool, UpstreamResponse
from harnessrl.runtime.proxy.workers import FORWARDED_HEADER
from starlette.types import Receive, Scope, Send

_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# Headers about one connection, not the call (RFC 9110 7.6.1), and the framing each side sets for itself.
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
    "host", "content-length",
})


def owner_address(base_url: str) -> str:
    """The address a worker serving at `base_url` puts at the end of the ids of the sessions it creates."""
    return urlsplit(base_url).netloc.lower()


def relay_address(session_id: str, own: str, ports: frozenset[int]) -> str | None:
    """Where to relay a call for `session_id` that this worker (at address `own`) does not hold: the owner's
    address when it is another worker of this proxy (a port in `ports`); None when the id names this worker, no
    owner, or an address outside this proxy."""
    _, dot, owner = session_id.partition(".")  # the random part has no dot (URL-safe base64)
    if not dot or owner == own:
        return None
    host, colon, port = owner.rpartition(":")
    own_host = own.rpartition(":")[0]
    if not colon or not port.isdigit() or int(port) not in ports:
        return None
    if host == own_host:
        return owner
    label, dot, domain = host.partition(".")
    if not dot or _is_ip(own_host) or not _LABEL.match(label):
        return None
    return owner if domain == own_host.partition(".")[2] else None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def relayed_headers(scope: Scope) -> dict[str, str]:
    """The call's headers as the owner gets them: without the hop-by-hop ones, marked as relayed."""
    decoded = ((k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"])
    headers = {k: v for k, v in decoded if k not in _HOP_BY_HOP}
    headers[FORWARDED_HEADER] = "1"
    return headers


def relayed_target(scope: Scope) -> str:
    """The call's path and query, as the caller sent them."""
    raw = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string") or b""
    return (raw + b"?" + query if query else raw).decode("latin-1")


async def relay(http: UpstreamPool, address: str, scope: Scope, body: bytes) -> Relayed:
    """Send the call to the worker at `address`; the answer's head is in, its body follows through `Relayed`."""
    url = f"http://{address}{relayed_target(scope)}"
    return Relayed(await http.request(scope["method"], url, body, relayed_headers(scope)))


@dataclass
class Relayed:
    """The owner's answer, sent on as it arrives. If the owner's connection breaks mid-body, the error propagates
    and the server aborts the caller's connection, so the caller sees a broken answer, never a cut one that looks
    whole."""

    response: UpstreamResponse

    async def send(self, send: Send, receive: Receive) -> None:
        response = self.response
        try:
            headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()
                       if k not in _HOP_BY_HOP]
            await send({"type": "http.response.start", "status": response.status, "headers": headers})
            while data := await response.readany():
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            response.release()
