"""Token splicing in the proxy (what and why: runtime/trajectory/splice.py): one engine call whose prompt holds
the session's earlier replies as the ids that were sampled.

A call whose history repeats replies of this session (by `reply_key`) is rendered by the engine (vLLM's
`/v1/chat/completions/render`: the chat template and tokenizer the chat endpoint would use), the sampled ids are
spliced in, and, when that changed the prompt, it is generated from tokens (`/inference/v1/generate`) and the
answer parsed back into a Chat Completion (`/v1/chat/completions/derender`: the engine's own tool and reasoning
parsers), so the dialects render it as any other. A prompt that splicing leaves as it is takes the ordinary chat
call. An engine without these endpoints (vLLM started without `--enable-scale-out`) serves the ordinary call.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from harnessrl.runtime.proxy.dialects.base import CanonicalRequest, ChatMessage, TextPart
from harnessrl.runtime.proxy.dialects.upstream import ChoiceLogprobs, Completion, Usage
from harnessrl.runtime.proxy.engines import Engine, EngineClient
from harnessrl.runtime.trajectory.models import as_tokens
from harnessrl.runtime.trajectory.splice import ROOT_CHAIN, Chain, chain_keys, reply_key, splice


class HistoryKeys:
    """A session's last request's assistant messages and their chain keys (`splice.chain_keys`). The canonical
    messages of a request's seen history are the very objects the previous request's were (`HistoryMemo`), so only
    the assistant messages after them are keyed: O(new messages) a call, not O(history) (a 10-reply history took
    ~170 us a call to key whole). One per session, used on the event loop only."""

    __slots__ = ("_keys", "_messages")

    def __init__(self) -> None:
        self._messages: list[ChatMessage] = []
        self._keys: list[bytes] = []

    def keys(self, request: CanonicalRequest, starts: Callable[[bytes], bool] = lambda key: True) -> list[bytes]:
        """The chain keys of the request's assistant messages; empty when it has none. `starts`: whether a key
        starts a path of the session's replies (`SessionGraph.has_chain`; see `splice.chain_keys`)."""
        replies = [m for m in request.messages if m.role == "assistant"]
        same = 0
        for new, was in zip(replies, self._messages, strict=False):
            if new is not was:
                break
            same += 1
        keys = self._keys[:same]
        keys += chain_keys((_reply_key(m) for m in replies[same:]), keys[-1] if keys else ROOT_CHAIN, starts)
        self._messages, self._keys = replies, keys
        return keys


def _reply_key(message: ChatMessage) -> str:
    return reply_key(_text(message.content),
                     [(c.function.name, c.function.arguments) for c in message.tool_calls or ()])


def _text(content: str | list[TextPart] | None) -> str:
    if isinstance(content, list):
        return "".join(part.text for part in content)
    return content or ""


async def end_token(client: EngineClient, engine: Engine, model: str) -> int | None:
    """The token the engine's chat template closes an assistant turn with: where a closed assistant message's
    rendering goes on past the same message rendered open (`continue_final_message`). Asked once per engine."""
    if engine.end_token is None:
        messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        probe: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": False}
        closed = await client.render(engine, json.dumps(probe).encode())
        opened = await client.render(engine, json.dumps(probe | {"continue_final_message": True}).encode())
        if closed is None or opened is None:
            return None
        head, whole = opened["token_ids"], closed["token_ids"]
        if len(whole) <= len(head) or whole[: len(head)] != head:
            engine.renders = False  # a template whose turns do not close with a token of their own
            return None
        engine.end_token = int(whole[len(head)])
    return engine.end_token


async def spliced_completion(client: EngineClient, engine: Engine, body_json: bytes, model: str,
                             chain: Chain) -> Completion | None:
    """The engine's answer to the call `body_json` (a Chat Completions body, as the ordinary call sends) with the
    chain's replies spliced into its prompt; None when splicing leaves the prompt as the template renders it, or
    the engine cannot splice (the caller then makes the ordinary call)."""
    if not engine.renders:
        return None
    end = await end_token(client, engine, model)
    rendered = await client.render(engine, body_json) if end is not None else None
    if rendered is None or end is None:
        return None
    spliced = splice(rendered["token_ids"], chain, end)
    if spliced is None or spliced.tokens == as_tokens(rendered["token_ids"]):
        return None
    prompt = spliced.tokens.tolist()
    generated = await client.generate(engine, generate_request(rendered, prompt))
    return await _derendered(client, engine, body_json, prompt, generated)


def generate_request(rendered: dict[str, Any], prompt: list[int]) -> dict[str, Any]:
    """The rendered request with the spliced prompt, whole (not streamed). A token budget the engine derived
    from the rendered prompt's length shrinks by what splicing added, so prompt + budget still fit the context."""
    params = dict(rendered["sampling_params"])
    grown = len(prompt) - len(rendered["token_ids"])
    if grown > 0 and isinstance(params.get("max_tokens"), int) and params["max_tokens"] > grown:
        params["max_tokens"] -= grown
    # `return_token_ids`: the answer carries its prompt, as the chat endpoint's does (what a recording of the
    # engine's answers reads).
    return rendered | {"token_ids": prompt, "sampling_params": params, "stream": False, "stream_options": None,
                       "return_token_ids": True}


async def _derendered(client: EngineClient, engine: Engine, body_json: bytes, prompt: list[int],
                      generated: dict[str, Any]) -> Completion:
    """The generate answer as a Completion carrying the prompt, the sampled ids and their logprobs. The stop
    token that ended the reply is left out of what is parsed into text (the chat endpoint does not show it
    either) and kept in the ids."""
    choice = generated["choices"][0]
    ids: list[int] = choice["token_ids"] or []
    logprobs = [entry["logprob"] for entry in (choice.get("logprobs") or {}).get("content") or ()]
    shown = ids
    if ids and choice.get("finish_reason") == "stop" and not isinstance(choice.get("stop_reason"), str):
        shown = ids[:-1]
    chat = json.loads(body_json)
    chat.update(stream=False)
    chat.pop("stream_options", None)
    if shown:
        content = (choice.get("logprobs") or {}).get("content")
        trimmed = choice | {"token_ids": shown, "logprobs": {"content": content[: len(shown)] if content else None}}
        completion = await client.derender(engine, {"model": chat.get("model"), "prompt_token_ids": prompt,
                                                    "generate_response": generated | {"choices": [trimmed]},
                                                    "chat_request": chat})
    else:  # the reply was its stop token alone: nothing to parse
        completion = Completion.model_validate({"model": chat.get("model", ""), "choices": [
            {"message": {"role": "assistant", "content": ""}, "finish_reason": choice.get("finish_reason")}]})
    return _with_tokens(completion, prompt, ids, logprobs)


def _with_tokens(completion: Completion, prompt: list[int], ids: Sequence[int], logprobs: list[float]) -> Completion:
    first = completion.choices[0]
    first.token_ids = list(ids)
    first.logprobs = ChoiceLogprobs(content=[{"logprob": lp} for lp in logprobs])
    completion.prompt_token_ids = prompt
    completion.usage = Usage(prompt_tokens=len(prompt), completion_tokens=len(ids), total_tokens=len(prompt) + len(ids))
    return completion
