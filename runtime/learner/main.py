"""`harnessrl learner --config FILE`: the learner and its coordinator in one process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path

from harnessrl.runtime import logs
from harnessrl.runtime.contracts.learner_config import load_config
from pydantic import ValidationError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="harnessrl learner", description="run the GRPO learner and its coordinator")
    parser.add_argument("--config", type=Path, required=True, help="LearnerConfig YAML/JSON file")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
    except (OSError, ValidationError, ValueError) as exc:
        print(f"harnessrl learner: bad config {args.config}: {exc}")
        return 2
    logs.configure(cfg.log_level)
    from harnessrl.runtime.contracts.learner_exit import LearnerFailure, write_termination_log
    from harnessrl.runtime.learner.distributed import init_world
    from harnessrl.runtime.learner.loop import Learner, build_trainer
    from harnessrl.runtime.learner.ranks import follow
    from harnessrl.runtime.learner.trainer import resolve_device

    try:
        # Under torchrun every process runs this; rank 0 runs the learner, the others follow its commands.
        world = init_world(resolve_device(cfg.model).type)
        if world.is_main:
            asyncio.run(Learner(cfg, world).serve())
        else:
            trainer, _ = build_trainer(cfg, world)
            follow(trainer, world)
    except LearnerFailure as failure:
        # The reason reaches the TrainingRun's Failed condition through the termination log; a failure no
        # restart can fix exits with EXIT_FAILED, which the Job and the local supervisor do not restart.
        logging.getLogger("harnessrl.learner").error("%s", failure)
        write_termination_log(failure)
        logging.shutdown()
        # A hung transfer thread must not hold the exit: state is already durable (checkpoint + journal).
        os._exit(failure.exit_code)
    return 0
