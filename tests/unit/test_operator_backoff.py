"""The per-run retry backoff after a refused or conflicting child (handlers/context.py Backoff)."""

from __future__ import annotations

from harnessrl.operator.control.backoff import Backoff

KEY = ("default", "run-a")


def test_backoff_doubles_and_a_new_version_retries_at_once() -> None:
    backoff = Backoff(first=60.0)
    assert backoff.due(KEY, ("uid-1", 1))
    assert backoff.failed(KEY, ("uid-1", 1)) == 60.0
    assert not backoff.due(KEY, ("uid-1", 1))
    assert backoff.failed(KEY, ("uid-1", 1)) == 120.0
    assert backoff.due(KEY, ("uid-1", 2))  # a spec change
    # The run deleted and created again under its name: generation 1 again, but another object.
    backoff.failed(KEY, ("uid-1", 1))
    assert backoff.due(KEY, ("uid-2", 1))
    assert backoff.failed(KEY, ("uid-2", 1)) == 60.0  # its failures count from one
    backoff.succeeded(KEY)
    assert backoff.due(KEY, ("uid-2", 1))
