"""`harnessrl torchrun ARGS`: torchrun (torch.distributed.run, the same arguments) that keeps the learner's
fatal exit status.

torchrun's agent ends with an uncaught ChildFailedError, status 1, whatever its workers exited with: a learner's
EXIT_FAILED (78: a failure no restart can fix, runtime/contracts/learner_exit.py) reached the Job as 1, so its
podFailurePolicy rule on 78 never fired and the restart budget went to failures no restart fixes. This runs
torchrun in this process, prints its report, and exits 78 if any worker did, else 1.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from harnessrl.runtime.contracts.learner_exit import EXIT_FAILED, EXIT_RESTART


def exit_status(failures: Mapping[int, Any]) -> int:
    """EXIT_FAILED if a worker exited with it (the others are stopped by the agent after it), else EXIT_RESTART."""
    return EXIT_FAILED if any(f.exitcode == EXIT_FAILED for f in failures.values()) else EXIT_RESTART


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except ChildFailedError as exc:
        print(exc.format_msg(), file=sys.stderr, flush=True)  # what torchrun's traceback would have shown
        return exit_status(exc.failures)
    return 0
