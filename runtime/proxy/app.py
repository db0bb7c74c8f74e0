"""The capture proxy's ASGI app: dialect calls (calls.py) as plain ASGI, everything else through a FastAPI app
with the admin router (admin.py), which also runs the lifespan and holds the state (state.py)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.routing import APIRoute
from harnessrl.runtime.contracts.proxy_config import ProxyConfig
from harnessrl.runtime.proxy.admin import proxy_state, router
from harnessrl.runtime.proxy.calls import dialect_call, error_answer
from harnessrl.runtime.proxy.dialects.base import DialectError
from harnessrl.runtime.proxy.dialects.routes import dialect_for_path
from harnessrl.runtime.proxy.state import build_state
from harnessrl.runtime.proxy.workers import WorkerRole
from starlette.types import Receive, Scope, Send

log = logging.getLogger("harnessrl.proxy")


def models_list(model: str) -> dict[str, Any]:
    """One model, in a shape both the OpenAI and the Anthropic SDKs read."""
    entry = {"id": model, "object": "model", "created": 0, "owned_by": "harnessrl", "type": "model",
             "display_name": model, "created_at": "1970-01-01T00:00:00Z"}
    return {"object": "list", "data": [entry], "has_more": False, "first_id": model, "last_id": model}


async def harness_get(path: str, request: Request) -> Any:
    """A GET no admin route took: the model list (under any path prefix), else not found in the path's dialect."""
    if path.endswith("v1/models") or path == "v1/models":
        return models_list(proxy_state(request).policy.model)
    answer = error_answer(dialect_for_path("/" + path), DialectError(f"no route GET /{path}", "not_found"))
    return Response(answer.body, answer.status, answer.headers, media_type="application/json")


def create_app(config: ProxyConfig, role: WorkerRole | None = None) -> ProxyApp:
    """The proxy for `config`; `role`: which worker of its replica it is, when it is one of several."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = build_state(config, role)
        app.state.proxy = state
        async with state.running():
            log.info("proxy %s up: %d sessions rebuilt, engines %s", config.replica_id, len(state.store),
                     [e.url for e in state.pool.engines])
            yield

    admin = FastAPI(title="harnessrl capture proxy", lifespan=lifespan, docs_url=None, redoc_url=None,
                    openapi_url=None)
    admin.include_router(router)
    admin.add_api_route("/{path:path}", harness_get, methods=["GET"])  # last: after every admin GET
    return ProxyApp(admin)


class ProxyApp:
    """The proxy's ASGI app. A POST to a path the admin API does not declare is a dialect call, served as plain
    ASGI; everything else goes to the admin FastAPI app (`admin.state.proxy` holds the state)."""

    def __init__(self, admin: FastAPI) -> None:
        self.admin = admin
        self.admin_posts = frozenset(r.path for r in admin.routes if isinstance(r, APIRoute) and "POST" in r.methods)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] not in self.admin_posts:
            answer = await dialect_call(self.admin.state.proxy, scope, receive)
            await answer.send(send, receive)
        else:
            await self.admin(scope, receive, send)
