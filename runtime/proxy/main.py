"""`harnessrl proxy --config FILE`: serve the capture proxy with uvicorn."""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from pathlib import Path

from pydantic import ValidationError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="harnessrl proxy", description="Run the capture proxy.")
    parser.add_argument("--config", required=True, type=Path, help="ProxyConfig file (YAML or JSON)")
    parser.add_argument("--port", type=int, help="override the config's port")
    args = parser.parse_args(argv)

    import uvicorn
    from harnessrl.runtime.proxy.app import create_app
    from harnessrl.runtime.proxy.config import load_config

    try:
        config = load_config(args.config)
        if args.port is not None:
            config = config.model_copy(update={"port": args.port})
        config.read_admin_token()
    except (OSError, ValueError, ValidationError) as exc:
        print(f"harnessrl proxy: bad config {args.config}: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # A call allocates thousands of short-lived containers (parsed bodies, stream chunks) while live sessions hold
    # many long-lived ones; with the default thresholds the collector ran so often, over so large a heap, that
    # it took ~28% of the proxy's CPU at 1,000 sessions (perf). Fewer, larger young collections and rarer full
    # ones cut CPU per call by ~15% there (benchmarks/proxy/results-before-after.md, session 4).
    gc.set_threshold(50_000, 20, 100)
    uvicorn.run(
        create_app(config),
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        access_log=False,  # one line per call is too much at 500 calls/s; /metrics counts them
        loop="uvloop",  # uvicorn[standard]'s picks (both dependencies): cheaper per call than asyncio and h11
        http="httptools",
        timeout_keep_alive=75,
        # Shut down without waiting long on streams; the journal holds everything already answered.
        timeout_graceful_shutdown=5,
    )
    return 0
