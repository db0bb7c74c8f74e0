"""The key an EnginePool's vLLM servers require (`VLLM_API_KEY`): vLLM checks `Authorization: Bearer <key>` on every
path under /v1, /v2, /inference and /cohere (its runtime LoRA load and unload among them); /health, /metrics,
/ping and /version stay open. The operator generates it per pool; the pool's servers, the operator and the
proxies and learners of the pool's runs hold it (a Secret, mounted as a file)."""

from __future__ import annotations

from pathlib import Path


def engine_headers(key_file: Path | None) -> dict[str, str]:
    """The headers that authenticate a call to the engine: none for an engine without a key."""
    if key_file is None:
        return {}
    key = key_file.read_text().strip()
    if not key:
        raise ValueError(f"engine API key file {key_file} is empty")
    return {"authorization": f"Bearer {key}"}
