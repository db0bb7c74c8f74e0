"""Learner memory admission: the learner's memory plan (runtime/contracts/learner_memory.py) against its GPUs, the
context length against the model's, and gradientCheckpointing: auto."""

from __future__ import annotations

from harnessrl.operator.api import reasons as R
from harnessrl.operator.api.trainingrun import EngineServers, ServedModel, TrainingRunSpec
from harnessrl.operator.plan.types import ContextTooLong, PlanError
from harnessrl.runtime.contracts.learner_memory import (
    GIB,
    KNOWN_SHAPES,
    MemoryPlan,
    ModelShape,
    TrainingSetup,
    fits,
    plan_memory,
)

# The longest sequence the memory plan assumes when engine.maxModelLen is empty (Qwen3's native context).
DEFAULT_CONTEXT_TOKENS = 32768


class LearnerMemoryError(PlanError):
    """The learner's memory plan does not fit its GPUs."""

    reason = R.LEARNER_MEMORY_TOO_SMALL


def memory_setup(spec: TrainingRunSpec, checkpointing: bool) -> TrainingSetup:
    lora = spec.model.adapter.lora
    return TrainingSetup(
        lora_rank=lora.rank if lora is not None else None,
        lora_targets=lora.target_modules if lora is not None else [],
        micro_batch_tokens=spec.learner.micro_batch_tokens,
        max_sequence_tokens=spec.engine.max_model_len or DEFAULT_CONTEXT_TOKENS,
        gradient_checkpointing=checkpointing,
        gpus=max(spec.learner.gpus, 1) * spec.learner.nodes,  # FSDP2 shards over every node's GPUs
        gpu_memory_bytes=spec.learner.gpu_memory_gib * GIB,
    )


def model_shape(spec: TrainingRunSpec) -> ModelShape | None:
    return known_shape(spec.model)


def known_shape(model: ServedModel) -> ModelShape | None:
    hub = model.base.hub
    return KNOWN_SHAPES.get(hub.repo) if hub is not None else None


# vLLM's own override for a context past the model's positions (it warns of NaNs and out-of-bounds reads).
ALLOW_LONG_CONTEXT_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


def check_context(servers: EngineServers, limit: int | None, source: str) -> None:
    """engine.maxModelLen against the longest sequence the model's config allows (runtime/contracts/learner_memory.py
    context_limit, as vLLM derives it: vLLM refuses to start past it); `limit` None: not known here."""
    wanted = servers.max_model_len
    override = any(e.name == ALLOW_LONG_CONTEXT_ENV and e.value_from is None and (e.value or "").lower() in ("1", "true")
                   for e in servers.env)
    if wanted is None or limit is None or wanted <= limit or override:
        return
    raise ContextTooLong(
        f"engine.maxModelLen {wanted} exceeds the {limit} positions {source} allows (max_position_embeddings and "
        f"its rope scaling, as vLLM reads them): vLLM would refuse to start. Set engine.maxModelLen to at most "
        f"{limit}, or serve a model whose config scales its rope to the length you need"
    )


def gradient_checkpointing(spec: TrainingRunSpec) -> bool:
    """learner.gradientCheckpointing; auto = on for a GPU learner unless its memory plan fits without it."""
    setting = spec.learner.gradient_checkpointing
    if setting != "auto":
        return setting == "on"
    if spec.learner.gpus == 0:
        return False
    shape = model_shape(spec)
    if shape is None:
        return True
    setup = memory_setup(spec, checkpointing=False)
    return not fits(plan_memory(shape, setup), setup)


def check_learner_memory(spec: TrainingRunSpec) -> MemoryPlan | None:
    """The learner's memory plan on its GPUs; raises LearnerMemoryError, with the numbers, if it cannot fit."""
    shape = model_shape(spec)
    if spec.learner.gpus == 0 or shape is None:
        return None
    setup = memory_setup(spec, gradient_checkpointing(spec))
    plan = plan_memory(shape, setup)
    if not fits(plan, setup):
        raise LearnerMemoryError(
            f"the learner needs about {plan.peak / GIB:.0f} GiB per GPU, more than learner.gpuMemoryGib "
            f"{spec.learner.gpu_memory_gib}: {plan.summary()}; lower learner.microBatchTokens or "
            "engine.maxModelLen, turn on learner.gradientCheckpointing, or add learner.gpus"
        )
    return plan
