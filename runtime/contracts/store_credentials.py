"""Per-run credentials of an EnginePool's adapter store (pure, standard library only: the operator makes them,
the store checks them)."""

from __future__ import annotations

import hashlib
import hmac
import re


def run_credential(token: str, run: str) -> str:
    """The store credential of one run on an EnginePool: its name and a MAC of it under the store's token."""
    return f"{run}.{_mac(token, run)}"


def _mac(token: str, run: str) -> str:
    return hmac.new(token.encode(), f"adapter-store/{run}".encode(), hashlib.sha256).hexdigest()


def run_of(token: str, given: str) -> str | None:
    """The run a per-run credential belongs to, or None when it is not one the store's token made."""
    run, _, mac = given.rpartition(".")
    return run if run and hmac.compare_digest(mac.encode(), _mac(token, run).encode()) else None


def owned(run: str, name: str) -> bool:
    """A run's adapters are `<run>-v<N>` (handlers/adapters.py relies on the same form)."""
    return re.fullmatch(rf"{re.escape(run)}-v\d+", name) is not None
