"""Free ports for the servers harnessrl starts: below the ephemeral range (so no outgoing connection takes one
between the pick and the bind), and never one something listens on."""

from __future__ import annotations

import socket

import pytest
from harnessrl.runtime import ports


def test_ports_are_below_the_ephemeral_range_and_free() -> None:
    for count in (1, 3):
        first = ports.free_ports(count)
        assert ports.LISTEN_PORTS.start <= first and first + count <= ports.LISTEN_PORTS.stop
        for port in range(first, first + count):
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))  # free: binds


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports.free_ports()))
        taken.listen()
        busy = taken.getsockname()[1]
        tries = iter([busy - 1, busy + 5])  # busy-1..busy (two ports) holds it; busy+5.. does not
        monkeypatch.setattr(ports.random, "randrange", lambda *_: next(tries))
        assert ports.free_ports(2) == busy + 5
