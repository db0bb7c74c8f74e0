"""`harnessrl view RUN_DIR [--host 127.0.0.1] [--port 0]`: serve the viewer and print its address.

It reads the run directory's journals and metrics (a run may still be writing them) and writes only its own
index, RUN_DIR/viewer/index.json (index.py), where it may. Port 0 takes a free port. It serves until
interrupted.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from harnessrl.runtime.serving import run_in_thread, server
from harnessrl.runtime.viewer.app import create_app


def address(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harnessrl view", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default 0: a free one)")
    args = parser.parse_args(argv)
    run_dir: Path = args.run_dir.resolve()
    if not (run_dir / "checkpoints").is_dir() and not (run_dir / "journal").is_dir():
        parser.error(f"{run_dir} is not a run directory (no checkpoints/ or journal/ in it)")
    http = server(create_app(run_dir), args.host, args.port)
    thread = run_in_thread(http)
    sock: socket.socket = http.servers[0].sockets[0]
    print(f"harnessrl view: {run_dir} at {address(args.host, sock.getsockname()[1])}", flush=True)
    try:
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        http.should_exit = True
        thread.join(5)
    return 0
