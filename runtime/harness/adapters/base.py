"""The adapter interface: what the runner needs to know to run one harness CLI headless on one task.

An adapter is pure: from a RunContext (instruction, model, the proxy URL for its dialect, the session key, paths
inside the sandbox) it builds an Invocation (argv, env, config files to write, files to read back), and from what
the run left (exit code, output, those files) it reads a HarnessResult. Sandboxes do the I/O.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from enum import StrEnum
from typing import Any, ClassVar

from harnessrl.runtime.contracts.harness_versions import Pin, pin
from harnessrl.runtime.contracts.runner_config import Dialect
from pydantic import BaseModel, ConfigDict, Field


class RunContext(BaseModel):
    model_config = ConfigDict(frozen=True)

    instruction: str
    model: str
    base_url: str = Field(description="the proxy session URL for this harness's dialect (what its SDK wants)")
    api_key: str = Field(description="the proxy session id: the harness's API key")
    step_budget: int = Field(ge=1)
    home: str = Field(description="HOME inside the sandbox")
    workspace: str = Field(description="the task's workspace inside the sandbox (the harness's cwd)")


class Invocation(BaseModel):
    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    # Absolute path inside the sandbox -> content, written before the harness starts (mode 0600).
    files: dict[str, str] = Field(default_factory=dict)
    # Absolute paths inside the sandbox read back after the run, for `Adapter.result`.
    collect: list[str] = Field(default_factory=list)
    # The whole argv is run with `sh -c` (custom harness templates).
    shell: bool = False


class HarnessStatus(StrEnum):
    finished = "finished"  # the harness ended its episode normally: grade the workspace
    step_budget = "step_budget"  # the harness stopped because the agent used up its steps
    harness_error = "harness_error"  # the harness failed (bad model output it could not handle, crash)


class HarnessResult(BaseModel):
    status: HarnessStatus
    detail: str = ""


class RunOutput(BaseModel):
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    collected: dict[str, str | None] = Field(default_factory=dict)


# Env every harness gets: no telemetry, update checks, colour or pagers in a headless run.
QUIET_ENV: dict[str, str] = {
    "CI": "1",
    "NO_COLOR": "1",
    "TERM": "dumb",
    "PAGER": "cat",
    "DO_NOT_TRACK": "1",
    "NO_UPDATE_NOTIFIER": "1",
    "npm_config_update_notifier": "false",
}


class Adapter(ABC):
    """One harness CLI. Subclasses set `name` (the HarnessPool name) and `dialect`."""

    name: ClassVar[str]
    dialect: Dialect

    @property
    def pin(self) -> Pin:
        return pin(self.name)

    @property
    def version(self) -> str:
        return self.pin.version

    @property
    def executable(self) -> str:
        return self.pin.bin

    @abstractmethod
    def invocation(self, ctx: RunContext) -> Invocation: ...

    def result(self, out: RunOutput) -> HarnessResult:
        """Default: exit code 0 means the harness finished its episode."""
        if out.exit_code == 0:
            return HarnessResult(status=HarnessStatus.finished)
        return HarnessResult(status=HarnessStatus.harness_error, detail=tail(out.stderr or out.stdout))


def tail(text: str, limit: int = 2000) -> str:
    return text[-limit:].strip()


def parse_json_output(text: str) -> Any:
    """The JSON document a CLI printed with a JSON output format: the whole stdout if it parses (some CLIs
    pretty-print one document or an array of events), else the last line that parses (logs came first)."""
    text = text.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line[:1] in ("{", "["):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def result_event(text: str) -> dict[str, Any] | None:
    """The {"type": "result", ...} event of Claude Code's JSON output (Qwen Code prints an array of such events)."""
    doc = parse_json_output(text)
    events = doc if isinstance(doc, list) else [doc]
    for event in reversed(events):
        if isinstance(event, dict) and event.get("type") == "result":
            return event
    return None


def claude_style_result(out: RunOutput) -> HarnessResult:
    """Outcome from a result event: subtype success / error_max_turns / error_*, and is_error."""
    event = result_event(out.stdout)
    if event is None:
        return HarnessResult(status=HarnessStatus.harness_error, detail=tail(out.stderr or out.stdout))
    subtype = str(event.get("subtype", ""))
    text = str(event.get("result", ""))
    if subtype == "error_max_turns":
        return HarnessResult(status=HarnessStatus.step_budget, detail=subtype)
    # Qwen Code reports a failed model call as a "successful" result whose text is the API error.
    if event.get("is_error") or subtype != "success" or text.startswith("[API Error"):
        return HarnessResult(status=HarnessStatus.harness_error, detail=f"{subtype}: {text}"[:2000])
    return HarnessResult(status=HarnessStatus.finished)
