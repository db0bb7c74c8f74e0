"""OpenCode (`opencode run`): speaks any of the four dialects through its AI SDK providers (default chat)."""

from __future__ import annotations

import json

from harnessrl.runtime.contracts.runner_config import Dialect
from harnessrl.runtime.harness.adapters.base import (
    QUIET_ENV,
    Adapter,
    HarnessResult,
    HarnessStatus,
    Invocation,
    RunContext,
    RunOutput,
    tail,
)

PROVIDER = "harnessrl"

# dialect -> (AI SDK provider package, path the SDK wants after the proxy's dialect base URL)
SDK: dict[str, tuple[str, str]] = {
    "openai_chat": ("@ai-sdk/openai-compatible", ""),
    "openai_responses": ("@ai-sdk/openai", ""),
    "anthropic": ("@ai-sdk/anthropic", "/v1"),  # the SDK appends /messages
    "gemini": ("@ai-sdk/google", "/v1beta"),  # the SDK appends /models/{m}:generateContent
}


def opencode_config(ctx: RunContext, dialect: str) -> dict[str, object]:
    package, suffix = SDK[dialect]
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": package,
                "name": "harnessrl proxy",
                "options": {"baseURL": ctx.base_url.rstrip("/") + suffix, "apiKey": ctx.api_key},
                "models": {ctx.model: {"name": ctx.model}},
            }
        },
        "model": f"{PROVIDER}/{ctx.model}",
        "small_model": f"{PROVIDER}/{ctx.model}",
        "autoupdate": False,
        "share": "disabled",
        # No git snapshots of the workspace after every step: the sandbox is thrown away anyway.
        "snapshot": False,
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
        "agent": {"build": {"steps": ctx.step_budget}},
    }


class OpenCode(Adapter):
    name = "opencode"

    def __init__(self, dialect: Dialect = "openai_chat") -> None:
        self.dialect = dialect

    def invocation(self, ctx: RunContext) -> Invocation:
        config_path = f"{ctx.home}/.config/harnessrl-opencode.json"
        env = {
            **QUIET_ENV,
            "OPENCODE_CONFIG": config_path,
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",  # do not read ~/.claude prompts and skills
            "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
            "OPENCODE_EXPERIMENTAL_DISABLE_FILEWATCHER": "1",
            # OpenCode installs plugin packages at start-up; a dead local registry makes that fail fast offline.
            "npm_config_registry": "http://127.0.0.1:9/",
        }
        return Invocation(
            argv=[self.executable, "run", "--format", "json", "-m", f"{PROVIDER}/{ctx.model}", ctx.instruction],
            env=env,
            files={config_path: json.dumps(opencode_config(ctx, self.dialect), indent=1)},
        )

    def result(self, out: RunOutput) -> HarnessResult:
        # `--format json` prints one event per line; failures arrive as {"type": "error", ...}.
        for line in out.stdout.splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and event.get("type") == "error":
                return HarnessResult(status=HarnessStatus.harness_error, detail=json.dumps(event)[:2000])
        if out.exit_code != 0:
            return HarnessResult(status=HarnessStatus.harness_error, detail=tail(out.stderr or out.stdout))
        return HarnessResult(status=HarnessStatus.finished)
