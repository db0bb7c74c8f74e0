"""Mini-SWE-Agent (`mini`), OpenAI Chat Completions through LiteLLM.

Its exit code is 0 even when the agent failed (format errors, limits), so the outcome is read from
`info.exit_status` in the trajectory file it writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
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

# Exception names mini records as exit_status when it stops on a limit.
LIMIT_STATUSES = frozenset({"LimitsExceeded", "TimeExceeded"})


class MiniSweAgent(Adapter):
    name = "mini-swe-agent"
    dialect = "openai_chat"

    def trajectory_path(self, ctx: RunContext) -> str:
        return f"{ctx.home}/mini.traj.json"

    def invocation(self, ctx: RunContext) -> Invocation:
        config_path = f"{ctx.home}/.config/mini-swe-agent/harnessrl.yaml"
        config = {
            "agent": {"step_limit": ctx.step_budget, "cost_limit": 0, "mode": "yolo", "confirm_exit": False},
            "environment": {"cwd": ctx.workspace},
            "model": {"model_kwargs": {"api_base": ctx.base_url, "api_key": ctx.api_key}},
        }
        env = {
            **QUIET_ENV,
            "MSWEA_CONFIGURED": "true",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_GLOBAL_CONFIG_DIR": f"{ctx.home}/.config/mini-swe-agent",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "OPENAI_API_BASE": ctx.base_url,
            "OPENAI_API_KEY": ctx.api_key,
        }
        return Invocation(
            argv=[
                self.executable,
                "-m",
                f"openai/{ctx.model}",
                "-t",
                ctx.instruction,
                "-y",
                "--exit-immediately",
                # -c replaces the default config, so name it first and merge ours over it.
                "-c",
                "mini.yaml",
                "-c",
                config_path,
                "-o",
                self.trajectory_path(ctx),
            ],
            env=env,
            files={config_path: yaml.safe_dump(config)},
            collect=[self.trajectory_path(ctx)],
        )

    def result(self, out: RunOutput) -> HarnessResult:
        raw = next((v for k, v in out.collected.items() if Path(k).name == "mini.traj.json"), None)
        if raw is None:
            return HarnessResult(status=HarnessStatus.harness_error, detail="no trajectory: " + tail(out.stderr or out.stdout))
        try:
            status = str(json.loads(raw).get("info", {}).get("exit_status", ""))
        except (json.JSONDecodeError, AttributeError):
            return HarnessResult(status=HarnessStatus.harness_error, detail="unreadable trajectory")
        if status == "Submitted":
            return HarnessResult(status=HarnessStatus.finished)
        if status in LIMIT_STATUSES:
            return HarnessResult(status=HarnessStatus.step_budget, detail=status)
        return HarnessResult(status=HarnessStatus.harness_error, detail=status or "no exit_status")
