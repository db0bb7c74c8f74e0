"""Claude Code (`claude -p`), Anthropic Messages dialect."""

from __future__ import annotations

import json

from harnessrl.runtime.harness.adapters.base import (
    QUIET_ENV,
    Adapter,
    HarnessResult,
    Invocation,
    RunContext,
    RunOutput,
    claude_style_result,
)


class ClaudeCode(Adapter):
    name = "claude-code"
    dialect = "anthropic"

    def invocation(self, ctx: RunContext) -> Invocation:
        env = {
            **QUIET_ENV,
            "ANTHROPIC_BASE_URL": ctx.base_url,
            "ANTHROPIC_API_KEY": ctx.api_key,  # sent as x-api-key
            # Background calls (titles, summaries) use the "small fast" model: keep them on the policy too.
            "ANTHROPIC_MODEL": ctx.model,
            "ANTHROPIC_SMALL_FAST_MODEL": ctx.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": ctx.model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": ctx.model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": ctx.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_BUG_COMMAND": "1",
            # --dangerously-skip-permissions refuses to run as root unless told it is in a sandbox.
            "IS_SANDBOX": "1",
        }
        settings = {"permissions": {"defaultMode": "bypassPermissions"}, "autoUpdates": False}
        return Invocation(
            argv=[
                self.executable,
                "-p",
                ctx.instruction,
                "--model",
                ctx.model,
                "--output-format",
                "json",
                "--max-turns",
                str(ctx.step_budget),
                "--dangerously-skip-permissions",
            ],
            env=env,
            files={f"{ctx.home}/.claude/settings.json": json.dumps(settings, indent=1)},
        )

    def result(self, out: RunOutput) -> HarnessResult:
        # `--output-format json` prints one {"type": "result", "subtype": ..., "is_error": ...} object.
        return claude_style_result(out)
