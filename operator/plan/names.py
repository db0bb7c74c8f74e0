"""The names of a run's children, the Secrets the operator generates, and the labels NetworkPolicies select by."""

from __future__ import annotations

from harnessrl.operator.api.common import COMPONENT_LABEL, POOL_LABEL, RUN_LABEL
from harnessrl.operator.plan.types import ComponentKind


def child_name(run: str, component: ComponentKind, pool: str | None = None) -> str:
    """Deterministic names: `<run>-engine`, `<run>-proxy`, `<run>-learner`, `<run>-<pool>-runner`."""
    return f"{run}-{pool}-{component}" if pool else f"{run}-{component}"


def runner_token_secret(run: str) -> str:
    """The Secret of the run's runner credential: runners send it, the learner's coordinator checks it."""
    return f"{run}-runner-token"


def engine_pool_store_secret(pool: str) -> str:
    """The Secret of an EnginePool's adapter-store token: its runs' learners upload with it."""
    return f"{child_name(pool, ComponentKind.ENGINE_POOL)}-store"


def engine_pool_api_key_secret(pool: str) -> str:
    """The Secret of the API key an EnginePool's vLLM servers require (runtime/engine/api_key.py)."""
    return f"{child_name(pool, ComponentKind.ENGINE_POOL)}-api-key"


def run_store_secret(run: str) -> str:
    """The Secret of a run's own credential at its EnginePool's adapter stores (it writes only the run's adapters:
    runtime/engine/adapter_store.py), derived by the operator from the pool's store token."""
    return f"{run}-adapter-store"


def proxy_headless_name(run: str) -> str:
    """The proxy's headless Service, which gives each replica its stable DNS name (`<run>-proxy` is the Service
    that reaches any replica)."""
    return f"{child_name(run, ComponentKind.PROXY)}-headless"


def sandbox_labels(run: str, pool: str) -> dict[str, str]:
    """Labels of a run's sandbox Pods: the NetworkPolicy that confines them selects on these."""
    return {RUN_LABEL: run, COMPONENT_LABEL: "sandbox", POOL_LABEL: pool}


def sandbox_name_prefix(run: str, pool: str) -> str:
    """What the names of a pool's sandbox Pods start with. Run and pool names are DNS labels (no dots) and no other
    Pod of a run has a dot in its name, so `<run>.<pool>.` is no other pool's or run's prefix and names nothing
    else: the chart's admission policy lets the pool's runners exec into these Pods only, and lets nobody else
    create a Pod so named (charts/harnessrl/templates/sandbox-policy.yaml)."""
    return f"{run}.{pool}."


def proxy_pod_labels(run: str) -> dict[str, str]:
    return {RUN_LABEL: run, COMPONENT_LABEL: str(ComponentKind.PROXY)}
