"""EngineConfig -> vLLM argv/env: the flags the proxy and learner depend on are always there."""

from __future__ import annotations

import pytest
from harnessrl.runtime.contracts.engine_config import EngineConfig
from harnessrl.runtime.contracts.engine_launch import VLLM_SERVER_MODULE, engine_command
from harnessrl.runtime.engine.lora import server_root
from pydantic import ValidationError


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_default_launch_serves_lora_tools_and_exact_logprobs() -> None:
    spec = engine_command(EngineConfig(model="/models/tiny", port=8123), python="/venv/bin/python")
    argv = spec.argv
    assert argv[:3] == ["/venv/bin/python", "-m", VLLM_SERVER_MODULE]
    assert flag_value(argv, "--model") == "/models/tiny"
    assert flag_value(argv, "--served-model-name") == "policy"
    assert flag_value(argv, "--port") == "8123" and flag_value(argv, "--host") == "127.0.0.1"
    assert "--enable-lora" in argv and flag_value(argv, "--max-lora-rank") == "16"
    assert "--enable-auto-tool-choice" in argv and flag_value(argv, "--tool-call-parser") == "hermes"
    assert flag_value(argv, "--logprobs-mode") == "processed_logprobs"
    # The model's generation_config must not inject sampling defaults behind the proxy's back.
    assert flag_value(argv, "--generation-config") == "vllm"
    assert spec.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert spec.env["VLLM_CPU_KVCACHE_SPACE"] == "2"


def test_gpu_launch_without_lora_or_tools() -> None:
    config = EngineConfig.model_validate(
        {
            "model": "Qwen/Qwen2.5-0.5B",
            "device": "cuda",
            "dtype": "bfloat16",
            "lora": {"enabled": False},
            "tool_call_parser": None,
            "tensor_parallel_size": 2,
            "gpu_memory_utilization": 0.8,
            "max_num_seqs": 64,
            "chat_template": "/t.jinja",
            "extra_args": ["--enforce-eager"],
            "env": {"VLLM_LOGGING_LEVEL": "DEBUG"},
        }
    )
    spec = engine_command(config)
    argv = spec.argv
    assert "--enable-lora" not in argv and "--enable-auto-tool-choice" not in argv
    assert flag_value(argv, "--tensor-parallel-size") == "2"
    assert flag_value(argv, "--gpu-memory-utilization") == "0.8"
    assert flag_value(argv, "--max-num-seqs") == "64"
    assert flag_value(argv, "--chat-template") == "/t.jinja"
    assert argv[-1] == "--enforce-eager"
    assert spec.env == {"VLLM_LOGGING_LEVEL": "DEBUG"}


def test_cpu_settings_and_explicit_env_win() -> None:
    config = EngineConfig.model_validate(
        {
            "model": "m",
            "cpu": {"kvcache_space_gib": 1, "omp_threads_bind": "0-1", "num_threads": 2},
            "env": {"VLLM_CPU_KVCACHE_SPACE": "4"},
        }
    )
    env = engine_command(config).env
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["OMP_NUM_THREADS"] == "2"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": ""}, "at least 1 character"),
        ({"model": "m", "extra_args": ["--port=9"]}, "--port"),
        ({"model": "m", "lora": {"max_rank": 12}}, "max_rank"),
        ({"model": "m", "served_model_name": "bad name"}, "served_model_name"),
        ({"model": "m", "unknown": 1}, "unknown"),
    ],
)
def test_bad_configs_are_rejected_in_their_own_terms(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        EngineConfig.model_validate(fields)


def test_base_url_points_at_a_reachable_host() -> None:
    assert EngineConfig(model="m", host="0.0.0.0", port=9000).base_url == "http://127.0.0.1:9000/v1"
    assert server_root("http://h:1/v1/") == "http://h:1" and server_root("http://h:1") == "http://h:1"
