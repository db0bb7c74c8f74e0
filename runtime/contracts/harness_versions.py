"""The pinned harness CLIs (harness_versions.json): one place that says which release of each CLI we run."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, RootModel

VERSIONS_FILE = Path(__file__).with_name("harness_versions.json")


class Pin(BaseModel):
    model_config = ConfigDict(extra="forbid")

    registry: Literal["npm", "pypi"]
    package: str
    version: str
    bin: str  # the launcher name users type, e.g. `claude`
    note: str = ""

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}" if self.registry == "npm" else f"{self.package}=={self.version}"


class Pins(RootModel[dict[str, Pin]]):
    pass


@cache
def pins() -> dict[str, Pin]:
    """Harness name -> pin, read once from versions.json."""
    return Pins.model_validate(json.loads(VERSIONS_FILE.read_text())).root


def pin(harness: str) -> Pin:
    table = pins()
    if harness not in table:
        raise KeyError(f"no pinned CLI for harness {harness!r}; known: {', '.join(sorted(table))}")
    return table[harness]
