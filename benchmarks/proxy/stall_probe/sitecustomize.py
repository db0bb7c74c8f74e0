"""Stall probe for the harnessrl proxy's workers: which of their event-loop stalls happen, how long, and where.

    STALL_PROBE_DIR=/tmp/stalls PYTHONPATH=$PWD/benchmarks/proxy/stall_probe \
        .venv/bin/python benchmarks/proxy/run.py --levels 5000@10 --targets baseline,harnessrl --proxy-config workers=2

Python imports `sitecustomize` at start-up from `PYTHONPATH` (an absolute path: the servers run in their own
directories), so every process the run starts loads this file; it acts only in proxy workers (`--worker N` on their
command line) and does nothing elsewhere. In a worker, once the proxy's sweeper task starts (it starts with the
loop), the loop writes a timestamp every 10 ms and a thread watches it. A tick later than `STALL_PROBE_MS` (default
80) is a stall. It is written to `$STALL_PROBE_DIR/<pid>.txt` with the loop thread's stack as it passed the
threshold, then again once the loop runs: its full length (~10 ms of timer jitter), and how long the loop thread
ran on a CPU from the first report to the end. That is about the same time when the loop was busy (a long step, a
garbage collection), and far less when the process was not running or the loop waited in the kernel (an fsync).
The thread needs the GIL to look, so a stall in the loop's Python code shows
that code's stack ~5 ms (the switch interval) after the threshold; a stack that ends in `run_until_complete` means
the loop was in C (uvloop) or not running.
"""

from __future__ import annotations

import os
import sys

if "--worker" in sys.argv and os.environ.get("STALL_PROBE_DIR"):
    import asyncio
    import threading
    import time
    import traceback
    from pathlib import Path

    from harnessrl.runtime.proxy.state import ProxyState

    _dir = Path(os.environ["STALL_PROBE_DIR"])
    _dir.mkdir(parents=True, exist_ok=True)
    _out = (_dir / f"{os.getpid()}.txt").open("a", buffering=1)
    _out.write(f"worker {sys.argv[sys.argv.index('--worker') + 1]}\n")
    _threshold_s = float(os.environ.get("STALL_PROBE_MS", "80")) / 1000
    _main = threading.main_thread().ident
    _beat = [time.monotonic()]
    _TICK_S = 0.01

    def _watch() -> None:
        loop_cpu = time.pthread_getcpuclockid(_main) if _main is not None else None
        stalled_since: float | None = None
        cpu_at_start = seen_at = 0.0
        while True:
            time.sleep(_TICK_S)
            last = _beat[0]
            if time.monotonic() - last - _TICK_S > _threshold_s and stalled_since != last:
                stalled_since = last
                cpu_at_start = time.clock_gettime(loop_cpu) if loop_cpu is not None else 0.0
                seen_at = time.monotonic()
                frame = sys._current_frames().get(_main)
                stack = "".join(traceback.format_stack(frame)[-10:]) if frame else "?\n"
                _out.write(f"{time.time():.3f} stall past {_threshold_s * 1000:.0f} ms, loop at:\n{stack}")
            elif stalled_since is not None and last != stalled_since:
                cpu = time.clock_gettime(loop_cpu) - cpu_at_start if loop_cpu is not None else float("nan")
                _out.write(f"{time.time():.3f} stall ended: {(last - stalled_since - _TICK_S) * 1000:.0f} ms, "
                           f"then {(time.monotonic() - seen_at) * 1000:.0f} ms more, of which the loop thread ran "
                           f"{cpu * 1000:.0f} ms\n")
                stalled_since = None

    async def _ticks() -> None:
        while True:
            _beat[0] = time.monotonic()
            await asyncio.sleep(_TICK_S)

    _sweeping = ProxyState._sweeping

    async def _probed_sweeping(self: ProxyState) -> None:
        ticks = asyncio.ensure_future(_ticks())
        threading.Thread(target=_watch, name="stall-probe", daemon=True).start()
        try:
            await _sweeping(self)
        finally:
            ticks.cancel()

    ProxyState._sweeping = _probed_sweeping  # type: ignore[method-assign]
