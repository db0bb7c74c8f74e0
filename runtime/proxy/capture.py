"""What the proxy records of one engine call: token ids, sampled logprobs, finish reason, tool calls.

`CallCapture` reads the engine's answer (a whole completion, or a stream chunk by chunk with work proportional to
the new tokens), parsing the prompt's ids beyond the session's known prefix only (see prompt_prefix.py); `to_turn`
makes the Turn. An invalid capture (logprobs not finite and <= 0, or not one per token) is still recorded, as
context only (`trainable=False`, decided by the call graph), so later turns keep linking to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from harnessrl.runtime.proxy.dialects.prompt_prefix import CHUNK, COMPLETION, KnownPrefix, read_answer
from harnessrl.runtime.proxy.dialects.upstream import Completion, CompletionChunk, FunctionDelta
from harnessrl.runtime.trajectory.models import Turn
from harnessrl.runtime.trajectory.splice import reply_key


@dataclass
class CallCapture:
    # The session's latest sequence when the call began: the prompt most likely starts with it.
    known: KnownPrefix | None = None
    prompt_ids: Sequence[int] = field(default_factory=list)
    # The prompt ids' JSON text as the engine wrote it (between the brackets): the session's next known prefix.
    prompt_text: bytes | None = None
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    tool_call_indices: set[int] = field(default_factory=set)
    chunks: int = 0
    saw_prompt_ids: bool = False
    # The call-graph turn the prompt was read to start with, all of it (`KnownPrefix.turn`): linking starts there.
    after: int | None = None
    # What the reply says, as the harness gets it (text, and tool calls as [name, arguments]): its `reply_key`.
    text: list[str] = field(default_factory=list)
    calls: dict[int, list[str]] = field(default_factory=dict)

    def read_chunk(self, data: bytes) -> CompletionChunk:
        """Parse one stream chunk's JSON and capture it."""
        chunk, text, after = read_answer(CHUNK, data, self.known)
        if text is not None:
            self.prompt_text, self.after = text, after
        self.feed(chunk)
        return chunk

    def read_completion(self, raw: bytes) -> Completion:
        """Parse a whole completion's JSON and capture it."""
        completion, self.prompt_text, self.after = read_answer(COMPLETION, raw, self.known)
        self.take(completion)
        return completion

    def feed(self, chunk: CompletionChunk) -> None:
        self.chunks += 1
        prompt_ids = chunk.get("prompt_token_ids")
        if prompt_ids is not None:
            self.prompt_ids = prompt_ids
            self.saw_prompt_ids = True
        for choice in chunk.get("choices", ()):
            if choice.get("index", 0) != 0:  # n is always 1 upstream
                continue
            token_ids = choice.get("token_ids")
            if token_ids:
                self.completion_ids.extend(token_ids)
            sampled = (choice.get("logprobs") or {}).get("content")
            if sampled:
                self.logprobs.extend(entry.get("logprob", 0.0) for entry in sampled)
            delta = choice.get("delta")
            if delta:
                content = delta.get("content")
                if content:
                    self.text.append(content)
                for call in delta.get("tool_calls") or ():
                    index = call.get("index")
                    index = index if index is not None else len(self.tool_call_indices)
                    self.tool_call_indices.add(index)
                    self._call_piece(index, call.get("function"))
            finish = choice.get("finish_reason")
            if finish is not None:
                self.finish_reason = finish

    def _call_piece(self, index: int, function: FunctionDelta | None) -> None:
        name_args = self.calls.setdefault(index, ["", ""])
        if function:
            name_args[0] += function.get("name") or ""
            name_args[1] += function.get("arguments") or ""

    @classmethod
    def from_completion(cls, completion: Completion) -> CallCapture:
        capture = cls()
        capture.take(completion)
        return capture

    def take(self, completion: Completion) -> None:
        """Capture a whole completion."""
        self.prompt_ids = completion.prompt_token_ids or []
        self.saw_prompt_ids = completion.prompt_token_ids is not None
        if completion.choices:
            choice = completion.choices[0]
            self.completion_ids = list(choice.token_ids or [])
            if choice.logprobs is not None and choice.logprobs.content:
                self.logprobs.extend(entry.get("logprob", 0.0) for entry in choice.logprobs.content)
            self.finish_reason = choice.finish_reason
            calls = choice.message.tool_calls or []
            self.tool_call_indices = set(range(len(calls)))
            self.text = [choice.message.content or ""]
            self.calls = {i: [(c.function and c.function.name) or "", (c.function and c.function.arguments) or ""]
                          for i, c in enumerate(calls)}

    def called(self) -> list[tuple[str, str]]:
        """The reply's tool calls, in order: (name, arguments as JSON text)."""
        return [(self.calls[i][0], self.calls[i][1]) for i in sorted(self.calls)]

    @property
    def tool_calls(self) -> int:
        return len(self.tool_call_indices)

    def to_turn(self, *, model: str, policy_version: int, started_at: float, finished_at: float) -> Turn:
        """The turn to record. Not validated here: the ids and logprobs were typed when the engine's answer was
        parsed, and the call graph checks `capture_problems` once when it links the turn (a turn that fails is
        kept as context only). The prompt ids may be the int32 array they were read into: the call graph links
        them as they are and stores only the new part."""
        return Turn.model_construct(
            prompt_ids=self.prompt_ids,
            completion_ids=self.completion_ids,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            policy_version=policy_version,
            model=model,
            tool_calls=self.tool_calls,
            started_at=started_at,
            finished_at=finished_at,
            trainable=True,
            reply=reply_key("".join(self.text), self.called()),
        )
