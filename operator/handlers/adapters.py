"""Unload from an EnginePool's servers the adapters no run on the pool owns any more: those of a run deleted
before it finished (a run that finishes unloads its own, runtime/learner/sync.py). Each run's adapters are
`<run>-v<N>` (plan/engine.py gives a run on a pool its name as adapter prefix); other names are left alone."""

from __future__ import annotations

import base64
import logging
import re

import httpx
from harnessrl.operator.control.apply import Kube
from harnessrl.operator.handlers.context import OperatorOptions
from harnessrl.operator.plan.names import engine_pool_api_key_secret, engine_pool_store_secret
from harnessrl.operator.plan.placement import ClusterPlacement
from harnessrl.operator.plan.types import EnginePoolPlan
from harnessrl.runtime.contracts.client import bearer

log = logging.getLogger("harnessrl.operator.adapters")
ADAPTER = re.compile(r"^(?P<run>.+)-v\d+$")
TIMEOUT_S = 10.0


def orphans(served: list[str], runs: list[str]) -> list[str]:
    """The adapters among `served` (model ids a server lists) whose run is not among `runs`."""
    return [name for name in served if (m := ADAPTER.match(name)) and m["run"] not in runs]


def collect(kube: Kube, pool: EnginePoolPlan, runs: list[str], options: OperatorOptions) -> list[str]:
    """Unload the orphaned adapters from every server and delete them from its store; returns their names.
    Best effort: a server that does not answer (starting, restarting) is tried again at the next reconcile."""
    secret = kube.get("v1", "Secret", pool.namespace, engine_pool_store_secret(pool.pool))
    key = kube.get("v1", "Secret", pool.namespace, engine_pool_api_key_secret(pool.pool))
    if secret is None or key is None:
        return []
    headers = bearer(base64.b64decode(secret["data"]["token"]).decode())
    engine_headers = bearer(base64.b64decode(key["data"]["token"]).decode())
    placement = ClusterPlacement(pool.namespace)
    unloaded: list[str] = []
    with httpx.Client(timeout=TIMEOUT_S, headers=engine_headers) as http:
        for replica in range(pool.engine.replicas):
            server, store = placement.engine_pool_urls(pool.pool, replica)
            fill = {"pool": pool.pool, "namespace": pool.namespace, "replica": replica}
            server = options.engine_pool_server_url_template.format(**fill) or server
            store = options.engine_pool_store_url_template.format(**fill) or store
            try:
                served = [m["id"] for m in http.get(f"{server}/v1/models").raise_for_status().json()["data"]]
                for name in orphans(served, runs):
                    http.post(f"{server}/v1/unload_lora_adapter", json={"lora_name": name}).raise_for_status()
                    http.delete(f"{store}/adapters/{name}", headers=headers).raise_for_status()
                    log.info("EnginePool %s/%s: unloaded %s from server %d: its run is gone",
                             pool.namespace, pool.pool, name, replica)
                    unloaded.append(name)
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                log.info("EnginePool %s/%s: server %d not collected: %s", pool.namespace, pool.pool, replica, exc)
    return unloaded
