"""Client-side helpers the `kube_api` fixture uses: manifest loading, API errors, fast kopf settings."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    import kopf


class KubeApiError(Exception):
    """A non-2xx answer of the emulator, carrying the Status object's code, reason and message."""

    def __init__(self, status: int, reason: str, message: str, body: dict[str, Any]) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body

    @classmethod
    def from_response(cls, status: int, body: dict[str, Any]) -> KubeApiError:
        return cls(status, str(body.get("reason", "")), str(body.get("message", "")), body)


def load_manifests(source: dict[str, Any] | list[dict[str, Any]] | str | Path) -> list[dict[str, Any]]:
    """Manifests from a dict, a list of dicts, a YAML path or YAML text (documents may be `kind: List`)."""
    if isinstance(source, Path):
        source = source.read_text()
    if isinstance(source, str):
        documents = [d for d in yaml.safe_load_all(source) if d]
    elif isinstance(source, dict):
        documents = [source]
    else:
        documents = list(source)
    manifests: list[dict[str, Any]] = []
    for document in documents:
        if not isinstance(document, dict) or "kind" not in document or "apiVersion" not in document:
            raise ValueError(f"not a Kubernetes manifest (needs apiVersion and kind): {str(document)[:200]}")
        if document["kind"] == "List":
            manifests.extend(load_manifests(document.get("items") or []))
        else:
            manifests.append(document)
    return manifests


def fast_kopf_settings() -> kopf.OperatorSettings:
    """kopf settings for tests: quick reconnects, bounded timeouts, quick shutdown, no peering objects."""
    import kopf

    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    settings.watching.server_timeout = 30
    settings.watching.client_timeout = 40
    settings.watching.connect_timeout = 5
    settings.watching.reconnect_backoff = 0.1
    settings.networking.request_timeout = 10
    settings.networking.error_backoffs = [0.1, 0.2, 0.5]
    settings.queueing.exit_timeout = 1.0
    settings.queueing.idle_timeout = 1.0
    settings.persistence.consistency_timeout = 2.0
    settings.process.ultimate_exiting_timeout = 5
    settings.background.instant_exit_timeout = 1.0
    return settings
