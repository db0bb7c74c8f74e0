"""Gemini CLI (`gemini -p`), Gemini generateContent dialect; and the settings it shares with its fork, Qwen Code."""

from __future__ import annotations

import json
from typing import Any

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


def gemini_result(out: RunOutput) -> HarnessResult:
    """`--output-format json` prints {"response": ..., "stats": ..., "error"?: {...}}."""
    if out.exit_code == EXIT_TURN_LIMIT:
        return HarnessResult(status=HarnessStatus.step_budget, detail="session turn limit reached")
    parsed = parse_json_output(out.stdout)
    doc = parsed if isinstance(parsed, dict) else None
    if out.exit_code == 0 and doc is not None and not doc.get("error"):
        return HarnessResult(status=HarnessStatus.finished)
    detail = json.dumps(doc.get("error"))[:2000] if doc and doc.get("error") else tail(out.stderr or out.stdout)
    return HarnessResult(status=HarnessStatus.harness_error, detail=detail)


class GeminiCli(Adapter):
    name = "gemini-cli"
    dialect = "gemini"

    def invocation(self, ctx: RunContext) -> Invocation:
        env = {
            **QUIET_ENV,
            "GOOGLE_GEMINI_BASE_URL": ctx.base_url,
            "GEMINI_API_KEY": ctx.api_key,  # sent as x-goog-api-key
            "GEMINI_MODEL": ctx.model,
            # The CLI re-execs itself with a bigger heap; one process is easier to limit and to kill.
            "GEMINI_CLI_NO_RELAUNCH": "true",
            "GEMINI_TELEMETRY_ENABLED": "false",
        }
        return Invocation(
            # Always pass -m: without it an "auto" router sends extra classification calls.
            argv=[self.executable, "-p", ctx.instruction, "-m", ctx.model, "--output-format", "json", "--yolo"],
            env=env,
            files={f"{ctx.home}/.gemini/settings.json": json.dumps(quiet_settings("gemini-api-key", ctx.step_budget), indent=1)},
        )

    def result(self, out: RunOutput) -> HarnessResult:
        return gemini_result(out)
