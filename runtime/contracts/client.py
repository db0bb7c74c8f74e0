"""What the contracts' typed clients share: the bearer credential they send, and a reply read into its model."""

from __future__ import annotations

from typing import TypeVar

import httpx
from pydantic import BaseModel

Reply = TypeVar("Reply", bound=BaseModel)


def bearer(token: str) -> dict[str, str]:
    """The header that carries a bearer credential: the run's runner token (the coordinator's lease routes, the
    proxy's session routes), the proxy's admin token, an engine's adapter-store token."""
    return {"Authorization": f"Bearer {token}"}


def reply(response: httpx.Response, model: type[Reply]) -> Reply:
    """The response's body as `model`. An answer outside 2xx raises httpx.HTTPStatusError (the response on it);
    a body that is not the model raises ValueError (pydantic's ValidationError, or the JSON decoder's)."""
    response.raise_for_status()
    return model.model_validate(response.json())
