"""Qwen Code (`qwen -p`), a Gemini CLI fork that speaks OpenAI Chat Completions."""

from __future__ import annotations

import json

from harnessrl.runtime.harness.adapters.base import (
    QUIET_ENV,
    Adapter,
    HarnessResult,
    HarnessStatus,
    Invocation,
    RunContext,
    RunOutput,
    claude_style_result,
)
from harnessrl.runtime.harness.adapters.gemini_cli import EXIT_TURN_LIMIT, quiet_settings


class QwenCode(Adapter):
    name = "qwen-code"
    dialect = "openai_chat"

    def invocation(self, ctx: RunContext) -> Invocation:
        env = {
            **QUIET_ENV,
            "OPENAI_BASE_URL": ctx.base_url,
            "OPENAI_API_KEY": ctx.api_key,
            "OPENAI_MODEL": ctx.model,
            "QWEN_CODE_NO_RELAUNCH": "true",
            "GEMINI_CLI_NO_RELAUNCH": "true",
        }
        return Invocation(
            argv=[self.executable, "-p", ctx.instruction, "-m", ctx.model, "--output-format", "json", "--yolo"],
            env=env,
            files={f"{ctx.home}/.qwen/settings.json": json.dumps(quiet_settings("openai", ctx.step_budget), indent=1)},
        )

    def result(self, out: RunOutput) -> HarnessResult:
        # Its JSON output is an array of Claude-Code-style events ending in a "result" event.
        if out.exit_code == EXIT_TURN_LIMIT:
            return HarnessResult(status=HarnessStatus.step_budget, detail="session turn limit reached")
        return claude_style_result(out)
