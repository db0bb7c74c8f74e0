"""`harnessrl runner --config FILE`: serve one HarnessPool's rollouts until the coordinator is done or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

import httpx
import prometheus_client
from harnessrl.runtime import logs, serving
from harnessrl.runtime.contracts.runner_config import RunnerConfig, load_config
from harnessrl.runtime.harness.adapters import adapter_for
from harnessrl.runtime.harness.runner import Runner
from harnessrl.runtime.harness.sandboxes import SandboxError, make_provider
from harnessrl.runtime.harness.tasks import load_dir, source_dir

log = logging.getLogger("harnessrl.runner")


async def serve(config: RunnerConfig) -> int:
    task_root = await asyncio.to_thread(source_dir, config.tasks)
    tasks = load_dir(task_root)
    adapter = adapter_for(config.harness)
    provider = make_provider(config, hide=[task_root, config.runner_token_file])
    log.info(
        "pool %s: %s %s (%s), %d tasks, %s sandbox, concurrency %d",
        config.pool, adapter.name, adapter.version, adapter.dialect, len(tasks), config.sandbox.kind, config.concurrency,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    timeout = httpx.Timeout(config.timeouts.session_s)
    async with httpx.AsyncClient(timeout=timeout) as http:
        runner = Runner(config, adapter, provider, tasks, http)
        metrics = None
        if config.metrics_port is not None:
            metrics = serving.server(prometheus_client.make_asgi_app(runner.metrics.registry), "0.0.0.0",
                                     config.metrics_port, limits=config.http)
            serving.run_in_thread(metrics)
        try:
            await runner.serve(stop)
        except SandboxError as exc:  # the sandbox cannot be had here: say why and stop, nothing was leased
            log.error("runner cannot start: %s", exc)
            return 2
        finally:
            if metrics is not None:
                metrics.should_exit = True
    log.info("runner stopped after %d rollouts", len(runner.completed))
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="harnessrl runner", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="RunnerConfig YAML/JSON file")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    logs.configure(config.log_level)
    return asyncio.run(serve(config))
