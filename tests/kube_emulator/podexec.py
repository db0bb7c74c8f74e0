"""`pods/exec` over WebSocket, as the API server relays it from the kubelet: the channel protocol
(v5.channel.k8s.io / v4.channel.k8s.io) that the official client's `kubernetes.stream.stream()` speaks.

Each message is one channel byte then data: 0 stdin, 1 stdout, 2 stderr, 3 the exit Status (JSON), and in v5 255
closes a channel (the client's stdin). The command runs in the Pod's container (tests/fixtures/container.py): a
bubblewrap PID namespace per Pod, started at its first exec, with the Pod's emptyDir volumes bound at their mount
paths over this machine's system read-only, the container's env, and processes that outlive the exec that started
them until something kills them (`kill -9 -1` reaches all but PID 1, as in a Pod). `drop_after_start` makes the
server cut the connection once the command started, as a restarting kubelet or API server would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web

from tests.fixtures.container import DRAIN_S, Command, Container

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, CLOSE = 0, 1, 2, 3, 255
# An image's default PATH (the emulator has no image to read it from).
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def exit_status(code: int) -> dict[str, Any]:
    """The Status the API server sends on channel 3 when the command ends."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
        "message": f"command terminated with non-zero exit code: exit status {code}",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


class PodExec:
    """Runs exec requests for the emulator's Pods; volumes live under one temporary directory."""

    def __init__(self) -> None:
        self._root: Path | None = None
        self.drop_after_start = False
        self.started: list[list[str]] = []  # each command run, in order (for assertions)
        self.containers: dict[str, Container] = {}  # by Pod uid

    @property
    def root(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="kube-emulator-volumes-"))
        return self._root

    def close(self) -> None:
        for container in self.containers.values():
            container.close()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)

    def binds(self, pod: dict[str, Any]) -> tuple[tuple[Path, str], ...]:
        meta, spec = pod["metadata"], pod["spec"]
        volumes = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
        container = spec["containers"][0]
        out = []
        for mount in container.get("volumeMounts", []):
            if mount["name"] in volumes:
                host = self.root / meta["namespace"] / meta["name"] / mount["name"]
                host.mkdir(parents=True, exist_ok=True)
                out.append((host, mount["mountPath"]))
        return tuple(out)

    def container(self, pod: dict[str, Any]) -> Container:
        meta = pod["metadata"]
        key = meta.get("uid") or f"{meta['namespace']}/{meta['name']}"
        if key not in self.containers:
            state = self.root / "_containers" / key.replace("/", "_")
            self.containers[key] = Container(self.binds(pod), state)
        return self.containers[key]

    @staticmethod
    def env(container: dict[str, Any]) -> dict[str, str]:
        return {"PATH": IMAGE_PATH, **{e["name"]: e.get("value", "") for e in container.get("env", [])}}

    async def start(self, pod: dict[str, Any], argv: list[str], stdin: bool) -> Command:
        spec = pod["spec"]["containers"][0]
        return await self.container(pod).exec(argv, self.env(spec), spec.get("workingDir", "/"), stdin)

    async def serve(self, request: aiohttp.web.BaseRequest, pod: dict[str, Any]) -> aiohttp.web.StreamResponse:
        argv = request.query.getall("command", [])
        want_stdin = request.query.get("stdin") in ("true", "1")
        ws = aiohttp.web.WebSocketResponse(protocols=PROTOCOLS)
        await ws.prepare(request)  # type: ignore[arg-type]
        v5 = ws.ws_protocol == PROTOCOLS[0]
        self.started.append(argv)
        try:
            proc = await self.start(pod, argv, want_stdin)
        except OSError as exc:
            await ws.send_bytes(bytes([ERROR]) + json.dumps(exit_status(126) | {"message": str(exc)}).encode())
            await ws.close()
            return ws
        if self.drop_after_start:
            await asyncio.sleep(0.2)
            proc.kill()
            # Gone without a status, as a dying server goes: no close handshake either.
            transport = request.transport
            if transport is not None:
                transport.abort()
            return ws

        async def pump(stream: asyncio.StreamReader, channel: int) -> None:
            while data := await stream.read(65536):
                await ws.send_bytes(bytes([channel]) + data)

        async def feed() -> None:
            async for msg in ws:
                # The official client sends stdin as a text frame (a channel character, then the data).
                raw = msg.data.encode() if msg.type == aiohttp.WSMsgType.TEXT else msg.data
                if msg.type not in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT) or not raw:
                    continue
                channel, data = raw[0], raw[1:]
                if channel == STDIN and proc.stdin is not None:
                    os.write(proc.stdin, data)
                elif channel == CLOSE and v5 and data[:1] == bytes([STDIN]) and proc.stdin is not None:
                    os.close(proc.stdin)
                    proc.stdin = None
            # The client went away: the command goes with it.
            proc.kill()

        feeder = asyncio.create_task(feed())
        pumps = asyncio.gather(pump(proc.stdout, STDOUT), pump(proc.stderr, STDERR))
        try:
            code = await proc.wait()
            # What it printed, but not what a process it left keeps printing.
            await asyncio.wait_for(asyncio.shield(pumps), DRAIN_S)
        except TimeoutError:
            pass
        except (ConnectionError, RuntimeError):
            code = None  # the client closed first
        try:
            if code is not None:
                await ws.send_bytes(bytes([ERROR]) + json.dumps(exit_status(code)).encode())
                await ws.close()
        except (ConnectionError, RuntimeError):
            pass  # the client closed first
        finally:
            proc.kill()
            pumps.cancel()
            feeder.cancel()
            for task in (pumps, feeder):
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, RuntimeError):
                    await task
        return ws
