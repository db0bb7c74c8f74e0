"""Free loopback ports for servers started on this machine (the local run, tests, benchmarks)."""

from __future__ import annotations

import random
import socket

# Below Linux's default ephemeral range (32768-60999), from which the OS takes the local port of every outgoing
# connection: a port picked there can be taken by one (a gloo or HTTP client connection) between the pick and
# the server's bind. Up here only another listener can take it, and the probe below sees listeners.
LISTEN_PORTS = range(20000, 32768)


def free_ports(count: int = 1) -> int:
    """The first of `count` consecutive ports nothing listens on right now (a proxy with workers needs its port
    and one per worker after it); the caller binds them soon after."""
    for _ in range(200):
        first = random.randrange(LISTEN_PORTS.start, LISTEN_PORTS.stop - count + 1)
        held: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports found on 127.0.0.1 in {LISTEN_PORTS.start}-{LISTEN_PORTS.stop - 1}")
