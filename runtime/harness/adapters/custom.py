"""A harness declared in the HarnessPool (command template + dialect): no code per harness."""

from __future__ import annotations

import shlex
from typing import ClassVar

from harnessrl.runtime.contracts.runner_config import PLACEHOLDERS, CustomHarnessSpec
from harnessrl.runtime.harness.adapters.base import QUIET_ENV, Adapter, Invocation, RunContext


class Custom(Adapter):
    name: ClassVar[str] = "custom"

    def __init__(self, spec: CustomHarnessSpec) -> None:
        self.spec = spec
        self.dialect = spec.dialect

    @property
    def version(self) -> str:
        return self.spec.image or "custom"

    @property
    def executable(self) -> str:
        return "sh"

    def render(self, ctx: RunContext) -> str:
        """The command line with each placeholder replaced by one shell-quoted word."""
        values = {
            "instruction": ctx.instruction,
            "model": ctx.model,
            "base_url": ctx.base_url,
            "api_key": ctx.api_key,
            "step_budget": str(ctx.step_budget),
            "workspace": ctx.workspace,
        }
        assert set(values) == set(PLACEHOLDERS)
        # The template was checked when the config was loaded (CustomHarnessSpec).
        return self.spec.command.format_map({k: shlex.quote(v) for k, v in values.items()})

    def invocation(self, ctx: RunContext) -> Invocation:
        env = {**QUIET_ENV, **self.spec.env, "HARNESSRL_BASE_URL": ctx.base_url, "HARNESSRL_API_KEY": ctx.api_key}
        return Invocation(argv=["sh", "-c", self.render(ctx)], env=env, shell=True)
