"""The CLI install `make tools` runs: idempotent over an installed prefix, launchers pointing at the pinned CLIs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from harnessrl.runtime.contracts.harness_versions import pins

from harnessrl.local.install_clis import install, launcher_target

pytestmark = pytest.mark.clis
PREFIX = Path(__file__).resolve().parents[2] / ".tools"


def test_install_is_idempotent_and_links_every_cli(harness_cli_path: str) -> None:
    assert install(PREFIX) == []  # everything is at its pinned version: nothing is reinstalled
    for pin in pins().values():
        launcher = PREFIX / "bin" / pin.bin
        assert launcher.is_symlink() and launcher.readlink() == launcher_target(PREFIX.resolve(), pin)
        if pin.registry == "npm":
            manifest = PREFIX / "npm" / "node_modules" / pin.package / "package.json"
            assert json.loads(manifest.read_text())["version"] == pin.version
    out = subprocess.run([str(PREFIX / "bin" / "codex"), "--version"], capture_output=True, text=True, timeout=60,
                         check=True, stdin=subprocess.DEVNULL)
    assert pins()["codex"].version in out.stdout
