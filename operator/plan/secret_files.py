"""The Secrets a component reads as files (tokens, API keys), at the paths its Placement gives."""

from __future__ import annotations

from harnessrl.operator.api.common import SecretKeyRef
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.plan.names import engine_pool_api_key_secret, runner_token_secret
from harnessrl.operator.plan.placement import Placement
from harnessrl.operator.plan.types import SecretFile


def runner_token_file(placement: Placement, run: str) -> SecretFile:
    return SecretFile(secret=runner_token_secret(run), key="token", path=placement.path("runner-token"))


def engine_pool_api_key(placement: Placement, pool: str) -> SecretFile:
    return SecretFile(secret=engine_pool_api_key_secret(pool), key="token", path=placement.path("engine-api-key"))


def secret_file(ref: SecretKeyRef, path: str) -> SecretFile:
    return SecretFile(secret=ref.name, key=ref.key, path=path)


def hub_read_tokens(spec: TrainingRunSpec, placement: Placement, *which: str) -> list[SecretFile]:
    """The Hub tokens that read a gated base model ("base-model-token") and task dataset ("tasks-token"), as
    files; `which` narrows to some of them."""
    sources = {"base-model-token": spec.model.base.hub, "tasks-token": spec.tasks.hub}
    return [secret_file(hub.token_secret, placement.path(what)) for what, hub in sources.items()
            if (not which or what in which) and hub is not None and hub.token_secret is not None]


def hub_token_env(token_file: str | None) -> dict[str, str]:
    """huggingface_hub (vLLM's and `hf download`'s) reads the token from the file HF_TOKEN_PATH names."""
    return {"HF_TOKEN_PATH": token_file} if token_file else {}
