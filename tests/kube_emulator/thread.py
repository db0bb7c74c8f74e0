"""Runs a KubeEmulator behind kmock's Server in a background thread with its own event loop.

A thread (not the test's loop) because the official client is synchronous and kopf runs in its own thread:
both must be able to block while the emulator keeps answering.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import kmock
import yaml

from .authz import User
from .server import KubeEmulator
from .store import Store

T = TypeVar("T")
_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 10.0


class EmulatorThread:
    """`with EmulatorThread() as api: api.url` — an emulator on 127.0.0.1:<free port> for the block's duration."""

    def __init__(self, history_limit: int = 10_000, users: dict[str, User] | None = None) -> None:
        self._history_limit = history_limit
        self._users = users  # token -> user: authenticate and authorize by RBAC (server.KubeEmulator.users)
        self._thread = threading.Thread(target=self._run, name="kube-emulator", daemon=True)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._emulator: KubeEmulator | None = None
        self._failure: BaseException | None = None
        self.url = ""

    @property
    def emulator(self) -> KubeEmulator:
        if self._emulator is None:
            raise RuntimeError("the emulator is not running")
        return self._emulator

    def __enter__(self) -> EmulatorThread:
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT):
            raise RuntimeError(f"the Kubernetes API emulator did not start within {_START_TIMEOUT} s")
        if self._failure is not None:
            raise RuntimeError("the Kubernetes API emulator failed to start") from self._failure
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(_STOP_TIMEOUT)
        if self._emulator is not None:
            self._emulator.pod_exec.close()
        if self._thread.is_alive():
            raise RuntimeError(f"the Kubernetes API emulator did not stop within {_STOP_TIMEOUT} s")
        if self._failure is not None and exc is None:
            raise RuntimeError("the Kubernetes API emulator failed while stopping") from self._failure

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as e:
            self._failure = e
        finally:
            self._ready.set()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        emulator = KubeEmulator(store=Store(history_limit=self._history_limit), users=self._users)
        async with emulator, kmock.Server(emulator) as server:
            self.url = str(server.url).rstrip("/")
            emulator._server_address = f"{server.host}:{server.port}"
            self._emulator = emulator
            self._ready.set()
            await self._stop.wait()
            emulator.close_watches()
            await asyncio.sleep(0.05)  # let the watch streams write their end

    def call(self, fn: Callable[[KubeEmulator], T], timeout: float = 10.0) -> T:
        """Run `fn(emulator)` in the emulator's loop (the store is single-threaded) and return its result."""
        if self._loop is None:
            raise RuntimeError("the emulator is not running")

        async def invoke() -> T:
            return fn(self.emulator)

        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(invoke(), self._loop)
        return future.result(timeout)

    def faults(self) -> list[Exception]:
        """Exceptions the emulator raised while serving (answered as HTTP 500): emulator bugs, not API errors."""
        return self.call(lambda emulator: list(emulator.errors))

    def kubeconfig(self, namespace: str = "default") -> str:
        """A kubeconfig document for this emulator (plain HTTP, a dummy bearer token)."""
        config: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator", "preferences": {},
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {"token": "emulator"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace}}],
        }
        return yaml.safe_dump(config, sort_keys=False)
