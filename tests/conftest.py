"""Loads every module in tests/fixtures/ as a pytest plugin, so fixtures are shared by all test trees."""

import pkgutil
from pathlib import Path

pytest_plugins = sorted(
    f"tests.fixtures.{module.name}" for module in pkgutil.iter_modules([str(Path(__file__).parent / "fixtures")])
)
