"""Failures of the learner that end its process with a reason, instead of a bare crash and a restart loop.

A `LearnerFailure` carries a reason (a CamelCase constant the operator shows as the TrainingRun's Failed
reason) and says whether a restart of the process can help. `harnessrl learner` writes "<reason>: <message>"
to the container's termination log and exits with `EXIT_FAILED` (the Job's podFailurePolicy fails the run at
once; the local supervisor does not restart it) or `EXIT_RESTART` (the Job's restart budget applies).
"""

from __future__ import annotations

import os
from pathlib import Path

# Exit statuses of `harnessrl learner`; the operator's Job podFailurePolicy and the local supervisor match them.
EXIT_FAILED = 78  # sysexits EX_CONFIG: what is wrong is the setup, not this process
EXIT_RESTART = 1
TERMINATION_LOG_ENV = "HARNESSRL_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")

# Reasons (the operator's Failed condition uses them as they are).
WEIGHT_SYNC_UNSUPPORTED = "WeightSyncUnsupported"  # the engine lacks vLLM's weight-transfer API or CUDA is missing
WEIGHT_SYNC_REJECTED = "WeightSyncRejected"  # the engine refused a transfer request (a version or config mismatch)
WEIGHT_SYNC_FAILED = "WeightSyncFailed"  # publishing kept failing for the whole retry window
WEIGHT_SYNC_HUNG = "WeightSyncHung"  # a transfer did not finish in time: the communicator is unusable
WEIGHT_SYNC_ADDRESS = "WeightSyncAddressNotLocal"  # the rendezvous address is not on this process's interfaces
TRACKER_UNAVAILABLE = "TrackerUnavailable"  # a configured tracker's package or credential is missing
REASONS = (WEIGHT_SYNC_UNSUPPORTED, WEIGHT_SYNC_REJECTED, WEIGHT_SYNC_FAILED, WEIGHT_SYNC_HUNG, WEIGHT_SYNC_ADDRESS,
           TRACKER_UNAVAILABLE)


class LearnerFailure(Exception):
    def __init__(self, reason: str, message: str, restartable: bool = False):
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.restartable = restartable

    @property
    def exit_code(self) -> int:
        return EXIT_RESTART if self.restartable else EXIT_FAILED


def write_termination_log(failure: LearnerFailure) -> Path | None:
    """Kubernetes shows this file's content as the container's termination message (at most 4 KiB)."""
    path = Path(os.environ.get(TERMINATION_LOG_ENV) or DEFAULT_TERMINATION_LOG)
    try:
        path.write_text(str(failure)[:4000])
    except OSError:  # not in a container (no /dev/termination-log): the log line is all there is
        return None
    return path


def parse_termination_message(text: str) -> tuple[str, str] | None:
    """(reason, message) of a termination message this module wrote, None for anything else."""
    reason, sep, message = text.partition(": ")
    return (reason, message) if sep and reason in REASONS else None
