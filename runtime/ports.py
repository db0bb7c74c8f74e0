"""Free loopback ports for servers started on this machine (the local run, tests, benchmarks)."""

from __future__ import annotations

import socket


def free_ports(count: int = 1) -> int:
    """The first of `count` consecutive ports nothing listens on right now (a proxy with workers needs its port
    and one per worker after it); the caller binds them soon after."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            first = int(probe.getsockname()[1])
        if count == 1:
            return first
        if first + count > 65535:
            continue
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
    raise RuntimeError(f"no {count} consecutive free ports found on 127.0.0.1")
