"""Codex CLI (`codex exec`), OpenAI Responses dialect.

Only a custom provider in $CODEX_HOME/config.toml reaches a local URL (OPENAI_BASE_URL alone tries a websocket
and the public host), so the adapter writes one with `wire_api = "responses"` and the key in an env var.
"""

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
    tail,
)

KEY_ENV = "HARNESSRL_API_KEY"


def toml_str(value: str) -> str:
    # JSON string escapes are valid TOML basic-string escapes.
    return json.dumps(value)


def config_toml(ctx: RunContext) -> str:
    return "\n".join(
        [
            f"model = {toml_str(ctx.model)}",
            'model_provider = "harnessrl"',
            'approval_policy = "never"',
            'sandbox_mode = "danger-full-access"',
            "check_for_update_on_startup = false",
            "",
            "[model_providers.harnessrl]",
            'name = "harnessrl proxy"',
            f"base_url = {toml_str(ctx.base_url)}",
            f'env_key = "{KEY_ENV}"',
            'wire_api = "responses"',
            "request_max_retries = 1",
            "stream_max_retries = 1",
            "",
            "[features]",
            "plugins = false",
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[feedback]",
            "enabled = false",
            "",
            "[history]",
            'persistence = "none"',
            "",
            f"[projects.{toml_str(ctx.workspace)}]",
            'trust_level = "trusted"',
            "",
        ]
    )


class Codex(Adapter):
    name = "codex"
    dialect = "openai_responses"

    def invocation(self, ctx: RunContext) -> Invocation:
        codex_home = f"{ctx.home}/.codex"
        return Invocation(
            argv=[
                self.executable,
                "exec",
                "--skip-git-repo-check",
                "--json",
                "--dangerously-bypass-approvals-and-sandbox",
                "-m",
                ctx.model,
                "-C",
                ctx.workspace,
                ctx.instruction,
            ],
            env={**QUIET_ENV, "CODEX_HOME": codex_home, KEY_ENV: ctx.api_key, "RUST_LOG": "error"},
            files={f"{codex_home}/config.toml": config_toml(ctx)},
        )

    def result(self, out: RunOutput) -> HarnessResult:
        # `--json` prints one event per line. {"type": "error"} events are also sent for retried transient
        # failures ("Reconnecting..."), so only a failed turn or the exit code decides.
        errors = []
        for line in out.stdout.splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and event.get("type") == "turn.failed":
                errors.append(json.dumps(event)[:500])
        if out.exit_code == 0 and not errors:
            return HarnessResult(status=HarnessStatus.finished)
        return HarnessResult(status=HarnessStatus.harness_error, detail="; ".join(errors) or tail(out.stderr))
