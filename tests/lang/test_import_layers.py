"""The modules of radixlm.lang that run programs import one way: program -> compiler -> tracer. Every import counts,
function-level and TYPE_CHECKING ones included (a local import that dodges a cycle is still a cycle)."""
from __future__ import annotations

import ast
from pathlib import Path

import radixlm.lang

LANG = Path(radixlm.lang.__file__).parent
LAYERED = ("radixlm.lang.program", "radixlm.lang.compiler", "radixlm.lang.tracer")


def _module_name(path: Path) -> str:
    parts = path.relative_to(LANG.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The radixlm.lang modules a file imports anywhere in it (`from package import module` counts as the module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n for n in names if n in modules}
    return found


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in LANG.rglob("*.py")}
    return {name: _imports(path, set(files)) - {name} for name, path in files.items()}


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), list(graph[start])
    while todo:
        m = todo.pop()
        if m == goal:
            return True
        if m not in seen:
            seen.add(m)
            todo += graph.get(m, ())
    return False


def test_program_compiler_and_tracer_are_on_no_import_cycle():
    graph = import_graph()
    assert set(LAYERED) <= set(graph)
    assert [m for m in LAYERED if _reaches(graph, m, m)] == []


def test_they_import_downwards_only():
    graph = import_graph()
    for i, m in enumerate(LAYERED):
        assert not graph[m] & set(LAYERED[:i]), f"{m} imports a module above it"
