"""tests/tiers.py's table names tests that exist (a moved or renamed module would otherwise leave its tier), and the
fast tier's expression selects what has no tier marker."""
from __future__ import annotations

import ast
from pathlib import Path

from tests import tiers

TESTS = Path(__file__).resolve().parent


def _defined(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}


def test_every_path_in_the_table_names_a_test():
    for key in tiers.PATHS:
        module, _, test = key.partition("::")
        found = [p for p in TESTS.rglob(Path(module).name) if p.as_posix().endswith("/" + module)]
        assert found, f"{key}: no such module under tests/"
        assert not test or any(test in _defined(p) for p in found), f"{key}: no such test"


def test_every_slow_module_exists():
    for key in tiers.SLOW_MODULES:
        assert [p for p in TESTS.rglob(Path(key).name) if p.as_posix().endswith("/" + key)], f"{key}: no such module"


def test_every_fixture_in_the_table_is_defined():
    defined = set().union(*(_defined(p) for p in TESTS.rglob("*.py")))
    assert set(tiers.FIXTURES) <= defined, set(tiers.FIXTURES) - defined
    assert tiers.INTERPRETER_CALLS <= defined


def test_markers_are_registered(pytestconfig):
    registered = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert set(tiers.ORDER) <= registered
