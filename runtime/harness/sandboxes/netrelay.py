"""The local sandbox's only way out of its network namespace: TCP on the namespace's loopback, relayed over a Unix
socket to the capture proxy.

Two halves, stdlib only (the inside half runs as `python -I -S netrelay.py` in the sandbox, with no packages):
- inside (`main`): listens on 127.0.0.1:PORT in the sandbox's network namespace for each `PORT=SOCKET` given,
  forks a relay that copies each connection to its Unix socket, and execs the harness. The harness's namespace
  has no other interface than loopback, so nothing else is reachable.
- outside (`UnixForwarder`): in the runner, accepts on that Unix socket and relays to the proxy's host and port.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import threading
from pathlib import Path


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        conn, _ = listener.accept()
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.connect(path)
        except OSError:
            conn.close()
            up.close()
            continue
        threading.Thread(target=_pump, args=(conn, up), daemon=True).start()
        threading.Thread(target=_pump, args=(up, conn), daemon=True).start()


def main(argv: list[str]) -> None:
    """argv: PORT=SOCKET ... -- COMMAND ..."""
    split = argv.index("--")
    listeners = []
    for spec in argv[:split]:
        port, path = spec.split("=", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", int(port)))
        sock.listen(128)
        listeners.append((sock, path))
    # Listening before the harness starts; the relay lives until the sandbox's PID namespace ends with the harness.
    if os.fork() == 0:
        os.setsid()
        threads = [threading.Thread(target=_serve, args=pair, daemon=True) for pair in listeners]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        os._exit(0)
    for sock, _ in listeners:
        sock.close()
    command = argv[split + 1 :]
    os.execvp(command[0], command)


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.write_eof()


class UnixForwarder:
    """Accepts on a Unix socket and relays each connection to host:port (in the runner's event loop)."""

    def __init__(self, path: Path, host: str, port: int) -> None:
        self.path, self.host, self.port = path, host, port
        self.server: asyncio.AbstractServer | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._handle, path=str(self.path))
        # The harness may run under another uid (a root runner drops to an unprivileged one).
        self.path.chmod(0o666)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            self.tasks.discard(task)
            return
        try:
            await asyncio.gather(_relay(reader, up_writer), _relay(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()
            self.tasks.discard(task)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await self.server.wait_closed()
            self.server = None


if __name__ == "__main__":
    main(sys.argv[1:])
