"""The package's layers import one way (read from the source, function-level imports included), and no module of
`forecasting` is part of an import cycle."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Top imports bottom only; modules on one line are independent of each other.
LAYERS = (
    ("forecasting.cli",),
    ("forecasting.tasks",),
    ("forecasting.service",),
    ("forecasting.evaluation",),
    ("forecasting.models",),
    ("forecasting.store", "forecasting.data"),
    ("forecasting.base",),
)


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(package: str) -> dict[str, set[str]]:
    """module -> the project modules it imports (`from a.b import c` counts as a.b and a.b.c)."""
    graph = {}
    for path in sorted((REPO / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
        graph[_module(path)] = {n for n in names if n.split(".")[0] in ("common", "forecasting", "scheduling")}
    return graph


def _layer(module: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if any(module == m or module.startswith(m + ".") for m in layer):
            return i
    return None


def _group(module: str) -> str | None:
    for layer in LAYERS:
        for m in layer:
            if module == m or module.startswith(m + "."):
                return m
    return None


def test_forecasting_layers_import_downwards_only():
    bad = []
    for module, imported in _imports("forecasting").items():
        for name in imported:
            here, there = _layer(module), _layer(name)
            if here is None or there is None:
                continue
            if there < here or (there == here and _group(name) != _group(module)):
                bad.append(f"{module} imports {name}")
    assert not bad, bad


def test_common_imports_neither_forecasting_nor_scheduling():
    bad = [f"{m} imports {n}" for m, names in _imports("common").items() for n in names
           if n.split(".")[0] in ("forecasting", "scheduling")]
    assert not bad, bad


def test_no_import_cycles_in_forecasting():
    graph = _imports("forecasting")
    modules = set(graph)
    edges = {m: {n for n in names if n in modules and n != m} for m, names in graph.items()}
    # A package's __init__ is not an import of its modules' siblings: drop package -> own submodule edges.
    edges = {m: {n for n in ns if not n.startswith(m + ".")} for m, ns in edges.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                cycle = visit(n)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, " -> ".join(cycle)
