"""How a harnessrl program starts another Python program of the package as a child process.

`python -m MODULE` (and `python -c`) put the working directory first on sys.path, so a folder there named like a
module the child has not imported yet is imported instead; a checkout's root holds `operator/`, the standard
library's `operator`. The child starts by `-c` with code that takes the working directory off sys.path before it
imports anything, then runs the module as `__main__` (runpy, as `-m` would). This holds whatever the working
directory and however the package is installed (no console script needs to sit beside the interpreter), for any
module (the evaluation coordinator has no `harnessrl` subcommand), without the interpreter flag `-P`.
"""

from __future__ import annotations

import sys

# The child's sys.argv is ["-c", MODULE, *args]; runpy gives the module the rest as `-m` would.
BOOTSTRAP = ("import sys; '' in sys.path and sys.path.remove(''); import runpy; "
             "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")


def python_module(module: str, *args: str) -> list[str]:
    """The argv that runs `module` (which must run as `__main__`) with `args` under this interpreter."""
    return [sys.executable, "-c", BOOTSTRAP, module, *args]
