"""Install the pinned harness CLIs as a user would: npm packages from the registry, mini-swe-agent from PyPI.

    python -m harnessrl.local.install_clis --prefix .tools

npm packages go to PREFIX/npm; launchers for every CLI (`claude`, `codex`, `opencode`, `gemini`, `qwen`,
`mini`) are symlinked into PREFIX/bin, which callers put on PATH. Idempotent: packages already at their pinned
version are not reinstalled.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from harnessrl.runtime.contracts.harness_versions import Pin, pins


def npm_installed_version(npm_prefix: Path, package: str) -> str | None:
    manifest = npm_prefix / "node_modules" / package / "package.json"
    if not manifest.is_file():
        return None
    return str(json.loads(manifest.read_text()).get("version"))


def pypi_installed_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def launcher_target(prefix: Path, pin: Pin) -> Path:
    if pin.registry == "npm":
        return prefix / "npm" / "node_modules" / ".bin" / pin.bin
    # The Python CLI lives next to the interpreter running this installer (the project's venv).
    return Path(sys.prefix) / "bin" / pin.bin


def link(launcher: Path, target: Path) -> None:
    if launcher.is_symlink() or launcher.exists():
        if launcher.is_symlink() and launcher.readlink() == target:
            return
        launcher.unlink()
    launcher.symlink_to(target)


def install(prefix: Path) -> list[str]:
    """Install what is missing or at the wrong version; return the specs that were installed."""
    prefix = prefix.resolve()
    npm_prefix = prefix / "npm"
    bin_dir = prefix / "bin"
    npm_prefix.mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    table = pins()
    npm_todo = [
        p.spec
        for p in table.values()
        if p.registry == "npm" and npm_installed_version(npm_prefix, p.package) != p.version
    ]
    pypi_todo = [
        p.spec for p in table.values() if p.registry == "pypi" and pypi_installed_version(p.package) != p.version
    ]
    for name, p in table.items():
        state = "to install" if p.spec in npm_todo + pypi_todo else "ok"
        print(f"[install] {name:15s} {p.spec:40s} {state}", flush=True)
    if npm_todo:
        print(f"[install] npm install {' '.join(npm_todo)}", flush=True)
        subprocess.run(
            ["npm", "install", "--prefix", str(npm_prefix), "--no-audit", "--no-fund", "--save-exact", *npm_todo],
            check=True,
        )
    if pypi_todo:
        print(f"[install] pip install {' '.join(pypi_todo)}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *pypi_todo], check=True)
    for p in table.values():
        target = launcher_target(prefix, p)
        if not target.exists():
            raise SystemExit(f"install: {p.package} installed but its launcher {target} is missing")
        link(bin_dir / p.bin, target)
        print(f"[install] {bin_dir / p.bin} -> {target}", flush=True)
    return npm_todo + pypi_todo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harnessrl-install", description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", type=Path, default=Path(".tools"), help="where to install (default .tools)")
    args = parser.parse_args(argv)
    done = install(args.prefix)
    print(f"[install] done ({len(done)} installed, launchers in {args.prefix / 'bin'})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
