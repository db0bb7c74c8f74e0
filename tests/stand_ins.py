"""Which tests run against the scripted engine (the vLLM stand-in that answers from a script), decided from the
code, so the README's count of them is reproducible: a test does if a scripted-engine fixture is in its fixture
closure (the CLI stack's `cli_backend` counts unless its module overrides it), or if its module imports the
scripted engine — at module level or in a helper or fixture (then every test of the module), or inside the test
function itself (then that test). A module that reaches it only through a subprocess (the benchmark smoke test)
marks itself `scripted`."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SCRIPTED_FIXTURES = {"scripted_engine", "scripted_engine_factory", "scripted_tiny_tokenizer"}
# Fixtures that are the scripted engine where they are defined (a module may override them with vLLM).
SCRIPTED_BY_DEFAULT = {"cli_backend": "tests.fixtures.harness_clis"}
SCRIPTED_MODULE = "tests.fakes.scripted_engine"


def imports_scripted(node: ast.AST) -> bool:
    """`from tests.fakes.scripted_engine import X`, `from tests.fakes import scripted_engine` or
    `import tests.fakes.scripted_engine`."""
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        return module == SCRIPTED_MODULE or (f"{module}.scripted_engine" == SCRIPTED_MODULE
                                             and any(a.name == "scripted_engine" for a in node.names))
    return isinstance(node, ast.Import) and any(a.name == SCRIPTED_MODULE for a in node.names)


@functools.cache
def scripted_imports(path: Path) -> tuple[bool, frozenset[str]]:
    """(whether the module as a whole uses the scripted engine, the test functions that import it themselves)."""
    tree = ast.parse(path.read_text())
    whole, tests = False, set()
    for top in tree.body:
        found = any(imports_scripted(node) for node in ast.walk(top))
        if not found:
            continue
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) and top.name.startswith("test_"):
            tests.add(top.name)
        else:
            whole = True
    return whole, frozenset(tests)


def uses_scripted_engine(item: pytest.Item) -> bool:
    if not isinstance(item, pytest.Function):
        return False
    if SCRIPTED_FIXTURES & set(item.fixturenames):
        return True
    for name, home in SCRIPTED_BY_DEFAULT.items():
        defs = item._fixtureinfo.name2fixturedefs.get(name)
        if defs and defs[-1].func.__module__ == home:
            return True
    whole, tests = scripted_imports(Path(item.module.__file__))
    return whole or item.originalname in tests
