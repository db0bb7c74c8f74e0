"""Runs a harness program in a pool worker (tests/e2e/direct_runner.py). Imports nothing heavy: every worker
imports it."""

import os
import sys


def execute(code: str, argv: list[str], env: dict[str, str], cwd: str) -> None:
    """Run `code` as `python3 -c CODE ARGS...` would (`argv` = ["-c", *ARGS]), in `cwd` with `env` added."""
    saved_env, saved_argv = dict(os.environ), sys.argv
    os.environ.update(env)
    sys.argv = argv
    os.chdir(cwd)
    try:
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
    except (Exception, SystemExit):  # a harness that fails or exits leaves what its process would
        pass
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
