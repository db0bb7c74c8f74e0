"""Client for vLLM's runtime LoRA endpoints (needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=True on the server).

The learner publishes each policy version as an adapter named `<name>-v<N>`; requests then select it by passing
that name as `model`."""

from __future__ import annotations

import httpx
from pydantic import BaseModel


class LoraLoadRequest(BaseModel):
    """vLLM's LoadLoRAAdapterRequest body."""

    lora_name: str
    lora_path: str
    load_inplace: bool = False


class LoraEndpointError(RuntimeError):
    """vLLM refused a LoRA load/unload; the message carries its status and body."""


def server_root(base_url: str) -> str:
    """Accepts the server root or its OpenAI base URL (…/v1) and returns the root."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _post(
    base_url: str, route: str, body: dict[str, object], client: httpx.Client | None, timeout_s: float
) -> None:
    url = f"{server_root(base_url)}{route}"
    if client is None:
        with httpx.Client(timeout=timeout_s) as own:
            response = own.post(url, json=body)
    else:
        response = client.post(url, json=body, timeout=timeout_s)
    if response.status_code != 200:
        raise LoraEndpointError(f"POST {route} -> {response.status_code}: {response.text[:500]}")


def load_lora_adapter(
    base_url: str,
    name: str,
    path: str,
    *,
    load_inplace: bool = False,
    client: httpx.Client | None = None,
    timeout_s: float = 120.0,
) -> None:
    """Load the PEFT adapter saved at `path` (as the server sees it) under `name`."""
    body = LoraLoadRequest(lora_name=name, lora_path=path, load_inplace=load_inplace).model_dump()
    _post(base_url, "/v1/load_lora_adapter", body, client, timeout_s)


def unload_lora_adapter(
    base_url: str, name: str, *, client: httpx.Client | None = None, timeout_s: float = 60.0
) -> None:
    _post(base_url, "/v1/unload_lora_adapter", {"lora_name": name}, client, timeout_s)
