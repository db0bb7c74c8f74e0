"""Qwen Code (`qwen -p`), a Gemini CLI fork that speaks OpenAI Chat Completions."""

from __future__ import annotations

from harnessrl.runtime.harness.adapters.base import HarnessResult, RunContext, RunOutput, claude_style_result
from harnessrl.runtime.harness.adapters.gemini_cli import GeminiCli


class QwenCode(GeminiCli):
    name = "qwen-code"
    dialect = "openai_chat"
    settings_dir = ".qwen"
    auth_type = "openai"

    def provider_env(self, ctx: RunContext) -> dict[str, str]:
        return {
            "OPENAI_BASE_URL": ctx.base_url,
            "OPENAI_API_KEY": ctx.api_key,
            "OPENAI_MODEL": ctx.model,
            "QWEN_CODE_NO_RELAUNCH": "true",
            "GEMINI_CLI_NO_RELAUNCH": "true",
        }

    def final_result(self, out: RunOutput) -> HarnessResult:
        # Its JSON output is an array of Claude-Code-style events ending in a "result" event.
        return claude_style_result(out)
