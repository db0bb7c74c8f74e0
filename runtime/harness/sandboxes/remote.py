"""Pure helpers for sandboxes that run commands through a remote shell (kubernetes exec, E2B)."""

from __future__ import annotations

import base64
import io
import shlex
import tarfile
from pathlib import Path

# Remote argv limits are about 128 KiB per argument on Linux; task files travel as base64 in one argument.
MAX_INLINE_BYTES = 96 * 1024

# Exit status of `timeout --signal=KILL` when it had to kill the command.
TIMEOUT_KILLED = 137


def shell_line(argv: list[str], env: dict[str, str], cwd: str, timeout_s: float | None = None) -> str:
    """One `sh -c` line: cd, set env, run argv (under coreutils `timeout` when given); every word quoted."""
    words = ["env", *(f"{k}={v}" for k, v in sorted(env.items())), *argv]
    if timeout_s is not None:
        words = ["timeout", "--signal=KILL", f"{max(1, int(timeout_s))}", *words]
    return f"cd {shlex.quote(cwd)} && exec " + " ".join(shlex.quote(w) for w in words)


def write_file_line(path: str, content: str) -> str:
    data = content.encode()
    if len(data) > MAX_INLINE_BYTES:
        raise ValueError(f"{path}: {len(data)} bytes is over the {MAX_INLINE_BYTES}-byte inline limit")
    b64 = base64.b64encode(data).decode()
    q = shlex.quote(path)
    return f"mkdir -p \"$(dirname {q})\" && printf %s {b64} | base64 -d > {q} && chmod 600 {q}"


def tar_b64(directory: Path, skip: frozenset[str] = frozenset({".keep"})) -> str:
    """A directory's files as a base64 gzip tarball (for small task directories)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(directory.rglob("*")):
            if path.name not in skip:
                tar.add(path, arcname=str(path.relative_to(directory)), recursive=False)
    data = buf.getvalue()
    if len(data) > MAX_INLINE_BYTES:
        raise ValueError(f"{directory}: {len(data)} compressed bytes is over the inline limit")
    return base64.b64encode(data).decode()


def untar_line(b64: str, dest: str) -> str:
    q = shlex.quote(dest)
    return f"mkdir -p {q} && printf %s {b64} | base64 -d | tar -xz -C {q}"


def read_file_line(path: str) -> str:
    """Prints the file base64-encoded (exact bytes through a text channel); exit 3 if it does not exist."""
    q = shlex.quote(path)
    return f"test -f {q} || exit 3; base64 {q}"
