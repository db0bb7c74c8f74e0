"""Gemini CLI (`gemini -p`), Gemini generateContent dialect; the base of its fork Qwen Code (qwen_code.py), which
takes the same flags, settings file layout and turn-limit exit code."""

from __future__ import annotations

import json
from typing import Any

from harnessrl.runtime.contracts.runner_config import Dialect
from harnessrl.runtime.harness.adapters.base import (
    QUIET_ENV,
    Adapter,
    HarnessResult,
    HarnessStatus,
    Invocation,
    RunContext,
    RunOutput,
    parse_json_output,
    tail,
)

# Gemini CLI's documented exit code when the session turn limit (model.maxSessionTurns) is reached.
EXIT_TURN_LIMIT = 53


def quiet_settings(auth_type: str, step_budget: int) -> dict[str, Any]:
    """settings.json for Gemini CLI and Qwen Code: no telemetry, updates or trust prompts; a turn limit."""
    return {
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True, "checkpointing": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "security": {"auth": {"selectedType": auth_type}, "folderTrust": {"enabled": False}},
        "model": {"maxSessionTurns": step_budget},
        "ide": {"enabled": False},
    }


class GeminiCli(Adapter):
    name = "gemini-cli"
    dialect: Dialect = "gemini"
    # Where the CLI reads its user settings (under HOME), and the auth type that uses an API key from the env.
    settings_dir = ".gemini"
    auth_type = "gemini-api-key"

    def provider_env(self, ctx: RunContext) -> dict[str, str]:
        return {
            "GOOGLE_GEMINI_BASE_URL": ctx.base_url,
            "GEMINI_API_KEY": ctx.api_key,  # sent as x-goog-api-key
            "GEMINI_MODEL": ctx.model,
            # The CLI re-execs itself with a bigger heap; one process is easier to limit and to kill.
            "GEMINI_CLI_NO_RELAUNCH": "true",
            "GEMINI_TELEMETRY_ENABLED": "false",
        }

    def invocation(self, ctx: RunContext) -> Invocation:
        settings = json.dumps(quiet_settings(self.auth_type, ctx.step_budget), indent=1)
        return Invocation(
            # Always pass -m: without it an "auto" router sends extra classification calls.
            argv=[self.executable, "-p", ctx.instruction, "-m", ctx.model, "--output-format", "json", "--yolo"],
            env={**QUIET_ENV, **self.provider_env(ctx)},
            files={f"{ctx.home}/{self.settings_dir}/settings.json": settings},
        )

    def result(self, out: RunOutput) -> HarnessResult:
        if out.exit_code == EXIT_TURN_LIMIT:
            return HarnessResult(status=HarnessStatus.step_budget, detail="session turn limit reached")
        return self.final_result(out)

    def final_result(self, out: RunOutput) -> HarnessResult:
        """`--output-format json` prints {"response": ..., "stats": ..., "error"?: {...}}."""
        parsed = parse_json_output(out.stdout)
        doc = parsed if isinstance(parsed, dict) else None
        if out.exit_code == 0 and doc is not None and not doc.get("error"):
            return HarnessResult(status=HarnessStatus.finished)
        detail = json.dumps(doc.get("error"))[:2000] if doc and doc.get("error") else tail(out.stderr or out.stdout)
        return HarnessResult(status=HarnessStatus.harness_error, detail=detail)
