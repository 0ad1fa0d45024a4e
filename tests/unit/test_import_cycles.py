"""Within each package of the library, modules import one another one way: no circle, not even
one drawn only for the type checker (an `if TYPE_CHECKING:` import)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGES = ["outbox", "outbox/core", "outbox/relay", "outbox/cli", "sinks/postgres", "sinks/kafka_source"]


def imports(folder: Path) -> dict[str, set[str]]:
    """Each module of the package (by file stem) and the package's modules it imports at its top
    level or under `if TYPE_CHECKING:`. Imports inside functions, made late on purpose, are not
    counted."""
    package = ".".join(folder.relative_to(REPO).parts)
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    graph: dict[str, set[str]] = {}
    for module in modules:
        body = ast.parse((folder / f"{module}.py").read_text()).body
        nodes = [*body, *(n for top in body if isinstance(top, ast.If) for n in top.body)]
        found: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.module == package:
                found |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(f"{package}."):
                found.add(node.module.removeprefix(f"{package}.").split(".")[0])
        graph[module] = (found & modules) - {module}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph, if it has one (depth-first, three colours)."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep] if dep in path else [node, dep]
            if dep not in state and (found := visit(dep, [*path, dep])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_imports_one_way(package: str) -> None:
    graph = imports(REPO / package)
    assert len(graph) >= 3, graph
    found = circle(graph)
    assert found is None, " -> ".join(found)


def test_a_circle_is_found() -> None:
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
