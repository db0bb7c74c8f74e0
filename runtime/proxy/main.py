"""`harnessrl proxy --config FILE`: serve the capture proxy with uvicorn."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="harnessrl proxy", description="Run the capture proxy.")
    parser.add_argument("--config", required=True, type=Path, help="ProxyConfig file (YAML or JSON)")
    parser.add_argument("--port", type=int, help="override the config's port")
    # Internal: the supervisor of a replica with `workers` > 1 starts each worker with its index (workers.py).
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--heartbeat-fd", type=int, help=argparse.SUPPRESS)  # the supervisor's pipe (workers.py)
    args = parser.parse_args(argv)

    from harnessrl.runtime import logs
    from harnessrl.runtime.contracts.proxy_config import load_config
    from harnessrl.runtime.proxy.allocator import use_mimalloc

    try:
        config = load_config(args.config)
        if args.port is not None:
            config = config.model_copy(update={"port": args.port})
        config.read_admin_token()
        config.read_runner_token()
        if args.worker is not None and not 0 <= args.worker < config.workers:
            raise ValueError(f"--worker {args.worker} is not one of the config's {config.workers} workers")
    except (OSError, ValueError, ValidationError) as exc:
        print(f"harnessrl proxy: bad config {args.config}: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.log_level)
    if config.allocator == "mimalloc":
        # Pays: −6% CPU per call, −5-7% RSS per session at 1,000 sessions @ 2 s (benchmarks/proxy/README.md, History).
        use_mimalloc()  # re-executes this process, before it has built anything, unless it runs on mimalloc already

    from harnessrl.runtime import serving
    from harnessrl.runtime.proxy.app import create_app
    from harnessrl.runtime.proxy.gc_policy import COLLECTOR
    from harnessrl.runtime.proxy.workers import listen_sockets, supervise, worker_config, worker_role

    if config.workers > 1 and args.worker is None:
        return supervise(config, args.config, args.port)
    # Each collection walks only what is new; the workers take turns for the periodic full one (gc_policy.py).
    # Pays: p99 added 224 -> 40 ms at 5,000 sessions @ 10 s; 23-37% less CPU per call at 1,000 @ 2 s (benchmarks/proxy/README.md, History).
    COLLECTOR.install(phase=(args.worker or 0) / config.workers)
    if args.worker is None:
        app, sockets = create_app(config), None
    else:
        try:
            sockets = listen_sockets(config, args.worker)
        except OSError as exc:
            print(f"harnessrl proxy: worker {args.worker} cannot listen: {exc}", file=sys.stderr)
            return 2
        app = create_app(worker_config(config, args.worker),
                         role=worker_role(config, args.worker, args.heartbeat_fd))
    # The call's own limit (answered in the caller's dialect) applies first; the server's is the backstop above it.
    limits = config.http.model_copy(update={"max_body_bytes": max(config.http.max_body_bytes, config.max_body_bytes)})
    server = serving.server(
        app, config.host, config.port, limits=limits, log_level=config.log_level,
        loop="uvloop",  # uvicorn[standard]'s pick (a dependency): cheaper per call than asyncio
        # Shut down without waiting long on streams; the journal holds everything already answered.
        timeout_graceful_shutdown=5,
    )
    server.run(sockets=sockets)
    return 0 if server.started else 3  # uvicorn's own code for a failed startup (say, an unreadable journal)


if __name__ == "__main__":  # how the supervisor starts a worker (runtime/programs.py)
    sys.exit(main(sys.argv[1:]))
