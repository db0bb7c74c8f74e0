"""The `harnessrl` console script: one subcommand per component.

Each subcommand lives in the module that owns it and exposes `main(argv) -> int`; the
modules are imported lazily so `harnessrl crds` does not pay for torch or vLLM.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module, help). Each module defines `main(argv: list[str]) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "crds": ("harnessrl.operator.api.crdgen", "generate the CRD YAML from the API models"),
    "operator": ("harnessrl.operator.main", "run the kopf operator"),
    "run": ("harnessrl.local.run", "run a TrainingRun on this machine, without a cluster"),
    "proxy": ("harnessrl.runtime.proxy.main", "run the capture proxy"),
    "learner": ("harnessrl.runtime.learner.main", "run the learner and its coordinator"),
    "torchrun": ("harnessrl.runtime.learner.launch", "torchrun that keeps a learner's fatal exit status (78)"),
    "runner": ("harnessrl.runtime.harness.main", "run a HarnessPool runner"),
    "eval": ("harnessrl.local.evaluate", "pass@1 of a checkpoint under each harness"),
    "report": ("harnessrl.local.report", "plots and a summary of a run directory"),
    "view": ("harnessrl.runtime.viewer.main", "browse a run directory's rollouts in the browser"),
    "tiny-model": ("harnessrl.local.tiny_model", "build the tiny test/quickstart model offline"),
    "adapter-store": ("harnessrl.runtime.engine.adapter_store", "receive LoRA adapters beside an engine (a sidecar)"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: harnessrl COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `harnessrl COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0
    if args[0] == "--version":
        from harnessrl import __version__

        print(__version__)
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"harnessrl: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
