"""`pods/exec` over WebSocket, as the API server relays it from the kubelet: the channel protocol
(v5.channel.k8s.io / v4.channel.k8s.io) that the official client's `kubernetes.stream.stream()` speaks.

Each message is one channel byte then data: 0 stdin, 1 stdout, 2 stderr, 3 the exit Status (JSON), and in v5 255
closes a channel (the client's stdin). The command runs in bubblewrap with the Pod's emptyDir volumes bound at
their mount paths (the "container" is this machine's system read-only, the volumes read-write), in its own PID and
network namespaces. `drop_after_start` makes the server cut the connection once the command started, as a
restarting kubelet or API server would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
from harnessrl.runtime.harness.sandboxes.bwrap import BwrapPlan, bwrap_argv

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, CLOSE = 0, 1, 2, 3, 255


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

    @property
    def root(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="kube-emulator-volumes-"))
        return self._root

    def close(self) -> None:
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

    def command(self, pod: dict[str, Any], argv: list[str]) -> list[str]:
        container = pod["spec"]["containers"][0]
        plan = BwrapPlan(bwrap="bwrap", rollout_dir=self.root / "_", read_only=(), binds=self.binds(pod))
        (self.root / "_").mkdir(exist_ok=True)
        return bwrap_argv(plan, argv, container.get("workingDir", "/"))

    async def serve(self, request: aiohttp.web.BaseRequest, pod: dict[str, Any]) -> aiohttp.web.StreamResponse:
        argv = request.query.getall("command", [])
        want_stdin = request.query.get("stdin") in ("true", "1")
        ws = aiohttp.web.WebSocketResponse(protocols=PROTOCOLS)
        await ws.prepare(request)  # type: ignore[arg-type]
        v5 = ws.ws_protocol == PROTOCOLS[0]
        self.started.append(argv)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command(pod, argv), stdin=asyncio.subprocess.PIPE if want_stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
            )
        except OSError as exc:
            await ws.send_bytes(bytes([ERROR]) + json.dumps(exit_status(126) | {"message": str(exc)}).encode())
            await ws.close()
            return ws
        if self.drop_after_start:
            await asyncio.sleep(0.2)
            self._kill(proc)
            await proc.wait()
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
                    proc.stdin.write(data)
                    await proc.stdin.drain()
                elif channel == CLOSE and v5 and data[:1] == bytes([STDIN]) and proc.stdin is not None:
                    proc.stdin.close()
            # The client went away: the command goes with it.
            self._kill(proc)

        assert proc.stdout is not None and proc.stderr is not None
        feeder = asyncio.create_task(feed())
        try:
            await asyncio.gather(pump(proc.stdout, STDOUT), pump(proc.stderr, STDERR))
            code = await proc.wait()
            await ws.send_bytes(bytes([ERROR]) + json.dumps(exit_status(code)).encode())
            await ws.close()
        except (ConnectionError, RuntimeError):
            pass  # the client closed first
        finally:
            self._kill(proc)
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
            await proc.wait()
        return ws

    @staticmethod
    def _kill(proc: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
