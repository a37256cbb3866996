"""No import circle at run time inside the package.

import-linter (``dev.py lint``) checks the layers between the package's parts; this walks every module's imports
as Python runs them, function-level imports included and ``if TYPE_CHECKING:`` blocks left out, and fails on any
circle among them: one module that needs another which needs the first, however late, makes the order of first
imports matter and each module harder to read on its own. (A circle through type annotations only is allowed.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import celery_redisdelay

PACKAGE = Path(celery_redisdelay.__file__).parent
ROOT = "celery_redisdelay"


def module_files() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name, for its ``__init__.py``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((ROOT, *parts))] = path
    return found


def type_checking_only(test: ast.expr) -> bool:
    """Whether an ``if`` tests ``TYPE_CHECKING`` (``typing.TYPE_CHECKING`` too)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def run_time_imports(nodes: Iterable[ast.AST]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run: at module level, in functions and classes, not under TYPE_CHECKING."""
    for node in nodes:
        if isinstance(node, ast.If) and type_checking_only(node.test):
            yield from run_time_imports(node.orelse)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        else:
            yield from run_time_imports(ast.iter_child_nodes(node))


def imported(name: str, node: ast.Import | ast.ImportFrom, modules: Mapping[str, Path]) -> set[str]:
    """The package's modules an import statement of module ``name`` loads."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            here = name if modules[name].name == "__init__.py" else name.rpartition(".")[0]
            for _ in range(node.level - 1):
                here = here.rpartition(".")[0]
            base = f"{here}.{base}" if base else here
        # `from pkg import module` loads the module; `from pkg import name`, the package (or module) ``pkg``
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    return {target for target in targets if target in modules}


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        graph[name] = set().union(*(imported(name, node, modules) for node in run_time_imports(tree.body))) - {name}
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            part = []
            while True:
                other = stack.pop()
                part.append(other)
                if other == module:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_walk_sees_the_imports_python_runs() -> None:
    graph = import_graph()
    assert "celery_redisdelay.extension" in graph[ROOT]  # from .extension import RedisDelay
    assert "celery_redisdelay.worker.strategies" in graph["celery_redisdelay.worker.stale"]  # from . import ...
    assert "celery_redisdelay.producer.bulk" in graph["celery_redisdelay.producer.task"]  # in a method
    assert "celery_redisdelay.producer.task" not in graph["celery_redisdelay.producer.bulk"]  # TYPE_CHECKING


def test_no_import_circle_at_run_time() -> None:
    graph = import_graph()
    found = [
        ", ".join(f"{importer} imports {other}" for importer in part for other in part if other in graph[importer])
        for part in circles(graph)
    ]
    assert not found, "import circles at run time (move what both need to a module of its own):\n" + "\n".join(found)


def test_a_circle_is_found() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
