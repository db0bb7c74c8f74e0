"""One adapter per harness CLI, and `adapter_for` to pick one from a pool's harness spec."""

from __future__ import annotations

from harnessrl.runtime.contracts.runner_config import CustomHarnessSpec, KnownHarnessSpec
from harnessrl.runtime.harness.adapters.base import Adapter
from harnessrl.runtime.harness.adapters.claude_code import ClaudeCode
from harnessrl.runtime.harness.adapters.codex import Codex
from harnessrl.runtime.harness.adapters.custom import Custom
from harnessrl.runtime.harness.adapters.gemini_cli import GeminiCli
from harnessrl.runtime.harness.adapters.mini_swe_agent import MiniSweAgent
from harnessrl.runtime.harness.adapters.opencode import OpenCode
from harnessrl.runtime.harness.adapters.qwen_code import QwenCode

KNOWN: dict[str, type[Adapter]] = {
    a.name: a for a in (ClaudeCode, Codex, OpenCode, GeminiCli, QwenCode, MiniSweAgent)
}


def adapter_for(spec: KnownHarnessSpec | CustomHarnessSpec) -> Adapter:
    if isinstance(spec, CustomHarnessSpec):
        return Custom(spec)
    adapter: Adapter = OpenCode(spec.dialect) if spec.name == "opencode" and spec.dialect else KNOWN[spec.name]()
    if spec.dialect is not None and spec.dialect != adapter.dialect:
        raise ValueError(f"harness {spec.name!r} speaks {adapter.dialect!r}, not {spec.dialect!r}")
    if spec.version is not None and spec.version != adapter.version:
        raise ValueError(
            f"harness {spec.name!r} version {spec.version!r} is not the pinned {adapter.version!r} "
            "(runtime/contracts/harness_versions.json): its adapter is written for that release"
        )
    return adapter


__all__ = ["KNOWN", "Adapter", "adapter_for"]
