"""Memory plan of the learner: peak memory per GPU of one training step, from the model's shape. Pure.

Terms (bytes, per GPU; FSDP2 shards parameters, gradients and optimizer states over the learner's GPUs):
- weights: the bf16 compute copy of every parameter (frozen base weights under LoRA), sharded.
- trainable states: per trainable parameter, an fp32 master (4) + fp32 gradient (4) + AdamW m and v (8),
  sharded. Full fine-tuning: every parameter; LoRA: the adapter's rank × (in + out) per targeted linear.
- activations: what the backward pass keeps, for the longest micro-batch. A micro-batch holds
  `micro_batch_tokens`, or one whole sequence when a sequence is longer (a sequence is never cut), so its
  size is max(micro_batch_tokens, max_sequence_tokens). Without checkpointing each layer keeps its bf16
  inputs and intermediates, ≈ 2 × (6·hidden + q + 2·kv + 4·intermediate) bytes per token (sdpa/flash
  attention: nothing quadratic in length); with checkpointing only each layer's input (2·hidden bytes per
  token) plus one layer's full set while it is recomputed.
- logits: TRL's fused LM head scores a chunk of tokens at a time; counted as `LOGIT_CHUNK` tokens of fp32
  logits and their gradient.
- overhead: CUDA context, allocator fragmentation and NCCL buffers, a fixed 3 GiB plus 10%.

It is an estimate for refusing specs that cannot fit (a 2M-token micro-batch), not a promise that one fits;
benchmarks/learner measures real peaks on a GPU.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

GIB = 1024**3
LOGIT_CHUNK = 4096
OVERHEAD_FIXED = 3 * GIB
OVERHEAD_SHARE = 0.10
TARGET_DIMS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Where a config.json gives the longest sequence, as vLLM reads them (the smallest one present wins).
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# Rope types whose max_position_embeddings is already the scaled length: vLLM does not multiply it by `factor`.
PRESCALED_ROPE = {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}


def context_limit(cfg: dict[str, Any]) -> int | None:
    """The longest sequence a model's config.json allows, as vLLM 0.32 derives it (`_get_and_verify_max_len`,
    which refuses a larger max_model_len): the smallest of its length keys (model_max_length overrides), times
    the rope scaling factor where the rope type does not pre-scale. None: the config gives no length."""
    lengths = [cfg[k] for k in LENGTH_KEYS if cfg.get(k) is not None]
    if not lengths:
        return None
    limit = float(cfg["model_max_length"] if cfg.get("model_max_length") else min(lengths))
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(rope, dict):
        kind = rope.get("rope_type") or rope.get("type") or "default"
        if kind not in PRESCALED_ROPE and rope.get("factor"):
            limit *= float(rope["factor"])
    return int(limit)


class ModelShape(BaseModel):
    """What memory depends on, as in a Hugging Face config.json of a Llama/Qwen-style decoder."""

    model_config = ConfigDict(frozen=True)

    hidden_size: int = Field(ge=1)
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    tie_word_embeddings: bool = False
    max_positions: int | None = Field(default=None, ge=1, description="context_limit of its config; None: unknown")

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelShape:
        heads = int(cfg["num_attention_heads"])
        return cls(
            hidden_size=cfg["hidden_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate_size=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_positions=context_limit(cfg),
        )

    def linear_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear of one layer."""
        h, q, kv, i = self.hidden_size, self.num_attention_heads * self.head_dim, self.kv_dim, self.intermediate_size
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def parameters(self) -> int:
        per_layer = sum(a * b for a, b in self.linear_dims().values()) + 2 * self.hidden_size
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + embeddings + self.hidden_size

    def lora_parameters(self, rank: int, targets: list[str]) -> int:
        dims = self.linear_dims()
        return self.num_hidden_layers * sum(rank * (dims[t][0] + dims[t][1]) for t in targets if t in dims)

    def activation_bytes_per_token_layer(self) -> int:
        q = self.num_attention_heads * self.head_dim
        return 2 * (6 * self.hidden_size + q + 2 * self.kv_dim + 4 * self.intermediate_size)


# Shapes of models the operator knows without downloading their config (the Hub repo ids of their configs); each
# Qwen3 config allows 40,960 positions (max_position_embeddings, rope_scaling null).
QWEN3_POSITIONS = 40960
KNOWN_SHAPES: dict[str, ModelShape] = {
    "Qwen/Qwen3-1.7B": ModelShape(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                                  head_dim=128, intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True,
                                  max_positions=QWEN3_POSITIONS),
    "Qwen/Qwen3-4B": ModelShape(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                                head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True,
                                max_positions=QWEN3_POSITIONS),
    "Qwen/Qwen3-8B": ModelShape(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                                head_dim=128, intermediate_size=12288, vocab_size=151936, max_positions=QWEN3_POSITIONS),
    "Qwen/Qwen3-14B": ModelShape(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8,
                                 head_dim=128, intermediate_size=17408, vocab_size=151936, max_positions=QWEN3_POSITIONS),
    "Qwen/Qwen3-32B": ModelShape(hidden_size=5120, num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
                                 head_dim=128, intermediate_size=25600, vocab_size=151936, max_positions=QWEN3_POSITIONS),
}


class TrainingSetup(BaseModel):
    model_config = ConfigDict(frozen=True)

    lora_rank: int | None = Field(description="None: full fine-tuning")
    lora_targets: list[str] = Field(default_factory=lambda: list(TARGET_DIMS))
    micro_batch_tokens: int = Field(ge=1)
    max_sequence_tokens: int = Field(ge=1, description="the longest sequence (the engine's context length)")
    gradient_checkpointing: bool
    gpus: int = Field(ge=1)
    gpu_memory_bytes: int = Field(ge=1)


class MemoryPlan(BaseModel):
    weights: int
    trainable_states: int
    activations: int
    logits: int
    overhead: int
    micro_batch_tokens: int = Field(description="tokens of the largest micro-batch")

    @property
    def peak(self) -> int:
        return self.weights + self.trainable_states + self.activations + self.logits + self.overhead

    def summary(self) -> str:
        def g(b: int) -> str:
            return f"{b / GIB:.1f} GiB"

        return (f"peak {g(self.peak)} per GPU = weights {g(self.weights)} + trainable states "
                f"{g(self.trainable_states)} + activations {g(self.activations)} ({self.micro_batch_tokens} tokens) "
                f"+ logits {g(self.logits)} + overhead {g(self.overhead)}")


def plan_memory(shape: ModelShape, setup: TrainingSetup) -> MemoryPlan:
    g = setup.gpus
    params = shape.parameters()
    trainable = params if setup.lora_rank is None else shape.lora_parameters(setup.lora_rank, setup.lora_targets)
    weights = 2 * params // g
    states = 16 * trainable // g
    tokens = max(setup.micro_batch_tokens, setup.max_sequence_tokens)
    per_layer = shape.activation_bytes_per_token_layer()
    layers = shape.num_hidden_layers
    if setup.gradient_checkpointing:
        activations = tokens * (layers * 2 * shape.hidden_size + per_layer)
    else:
        activations = tokens * layers * per_layer
    logits = min(tokens, LOGIT_CHUNK) * shape.vocab_size * 4 * 2
    subtotal = weights + states + activations + logits
    return MemoryPlan(weights=weights, trainable_states=states, activations=activations, logits=logits,
                      overhead=OVERHEAD_FIXED + int(OVERHEAD_SHARE * subtotal), micro_batch_tokens=tokens)


def fits(plan: MemoryPlan, setup: TrainingSetup) -> bool:
    return plan.peak <= setup.gpu_memory_bytes
