"""The e2b sandbox: one E2B sandbox per rollout through the `e2b` SDK.

E2B runs outside the cluster, so the harness reaches the proxy at the pool's public URL: the session's base URL
keeps its path (the session route) and takes the public origin. That URL lands on any proxy replica and worker,
which relays the call to the one that holds the session (runtime/proxy/relay.py; the session id names it). Egress is limited to the proxy's host with E2B's
network options (allow the proxy, deny everything else). Sandboxes carry metadata naming the pool and runner;
`start` kills those a crashed runner left. Files and commands go through the SDK's filesystem and command APIs.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from harnessrl.runtime.contracts.runner_config import E2BSandboxConfig
from harnessrl.runtime.harness.sandboxes import remote
from harnessrl.runtime.harness.sandboxes.base import ExecResult, SandboxError, SandboxProvider
from harnessrl.runtime.harness.tasks import Task

log = logging.getLogger(__name__)

USER = "user"
HOME = "/home/user"
TESTS = "/home/user/.harnessrl/tests"
LOGS = "/home/user/.harnessrl/logs"


def public_url(url: str, public: str) -> str:
    """`url` with the scheme and host of `public` (and its path prefix before url's path)."""
    src, pub = urlsplit(url), urlsplit(public)
    path = pub.path.rstrip("/") + src.path
    return urlunsplit((pub.scheme, pub.netloc, path, src.query, ""))


def owner_metadata(pool: str, runner_id: str) -> dict[str, str]:
    return {"managed-by": "harnessrl", "harnessrl-pool": pool, "harnessrl-runner": runner_id}


def create_kwargs(config: E2BSandboxConfig, api_key: str, pool: str, runner_id: str, rollout_id: str) -> dict[str, Any]:
    """Arguments of `AsyncSandbox.create` for one rollout."""
    kwargs: dict[str, Any] = {
        "template": config.template,
        "timeout": config.sandbox_timeout_s,
        "metadata": {**owner_metadata(pool, runner_id), "harnessrl-rollout": rollout_id},
        "envs": {"LOGS_DIR": LOGS},
        "api_key": api_key,
        # Only the proxy: allow its host, deny every other destination.
        "network": {"allow_out": [urlsplit(str(config.proxy_public_url)).hostname], "deny_out": ["0.0.0.0/0"]},
    }
    if config.domain:
        kwargs["domain"] = config.domain
    return kwargs


def infra_error(doing: str, exc: Exception) -> SandboxError:
    """E2B's SDK errors as the runner's infrastructure error (the rollout is retried, never scored), named by kind:
    its TimeoutException (a SandboxException, not the builtin TimeoutError), not found, rate limit (429), service
    busy (503), authentication, and transport errors."""
    from e2b import (
        AuthenticationException,
        NotFoundException,
        RateLimitException,
        ServiceBusyException,
        TimeoutException,
    )

    kinds = [(TimeoutException, "timed out"), (NotFoundException, "sandbox not found"), (RateLimitException,
             "rate limited"), (ServiceBusyException, "service busy"), (AuthenticationException, "authentication failed")]
    kind = next((name for cls, name in kinds if isinstance(exc, cls)), type(exc).__name__)
    return SandboxError(f"e2b {doing}: {kind}: {exc}")


class E2BSandbox(remote.RemoteShellSandbox):
    def __init__(self, provider: E2BProvider, sbx: Any, workdir: str) -> None:
        self.provider = provider
        self.sbx = sbx
        self.home = HOME
        self.workspace = workdir
        self.tests_dir = TESTS
        self.logs_dir = LOGS
        self._closed = False

    def proxy_url(self, url: str) -> str:
        return public_url(url, str(self.provider.config.proxy_public_url))

    async def _sh(self, line: str, timeout_s: float) -> ExecResult:
        from e2b import CommandExitException

        started = time.monotonic()
        try:
            # As `user` always (not the template's default, which may be root): KILL_ALL then reaches the agent's
            # processes and never envd's.
            res = await self.sbx.commands.run(line, timeout=timeout_s, user=USER)
        except CommandExitException as exc:  # a non-zero exit is a result, not an error
            res = exc
        except Exception as exc:
            # The command's own limit is coreutils `timeout` inside (remote.shell_line); an SDK timeout here means
            # the sandbox stopped answering. Gone, timed out, rate limited, unreachable: all infrastructure.
            raise infra_error("running a command", exc) from exc
        return ExecResult(
            exit_code=res.exit_code, stdout=res.stdout or "", stderr=res.stderr or "", duration_s=time.monotonic() - started
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.sbx.kill()
        except Exception as exc:  # already gone, network: the sandbox's own timeout ends it anyway
            log.warning("killing e2b sandbox: %s", exc)
        self.provider.open_sandboxes.discard(self)


class E2BProvider(SandboxProvider):
    def __init__(self, config: E2BSandboxConfig, pool: str, runner_id: str) -> None:
        self.config = config
        self.pool = pool
        self.runner_id = runner_id
        self.open_sandboxes: set[E2BSandbox] = set()

    def api_key(self) -> str:
        key = self.config.api_key_file.read_text().strip()
        if not key:
            raise SandboxError(f"e2b api key file {self.config.api_key_file} is empty")
        return key

    async def start(self) -> None:
        from e2b import AsyncSandbox
        from e2b.sandbox.sandbox_api import SandboxQuery

        paginator = AsyncSandbox.list(
            query=SandboxQuery(metadata=owner_metadata(self.pool, self.runner_id)), api_key=self.api_key()
        )
        while paginator.has_next:
            for info in await paginator.next_items():
                await AsyncSandbox.kill(info.sandbox_id, api_key=self.api_key())

    async def open(self, rollout_id: str, task: Task) -> E2BSandbox:
        from e2b import AsyncSandbox

        try:
            sbx = await AsyncSandbox.create(**create_kwargs(self.config, self.api_key(), self.pool, self.runner_id, rollout_id))
        except Exception as exc:
            raise infra_error("creating a sandbox", exc) from exc
        sandbox = E2BSandbox(self, sbx, self.config.workdir)
        self.open_sandboxes.add(sandbox)
        try:
            await sandbox.put_dir(remote.tar_b64(task.environment_dir), sandbox.workspace)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def shutdown(self) -> None:
        for sandbox in list(self.open_sandboxes):
            await sandbox.close()
