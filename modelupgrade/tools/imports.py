"""The project's import graph, read from the source (nothing is imported).

The graph counts every import statement, including those inside functions: a function-level import
runs when the function does, so it belongs to the module's dependencies as much as one at the top.
``import a.b.c`` in module m runs ``a``, ``a.b`` and ``a.b.c``; packages that are ancestors of m are
already initialising and add no edge, but ``from a.b import name`` where ``a.b`` is an ancestor of m
does: it reads a name from a package ``__init__`` that may be mid-import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path


def module_paths(package_dir: Path) -> dict[str, Path]:
    """Dotted module name → file, for every module of the package at ``package_dir``."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_names(module: str, path: Path) -> Iterator[str]:
    """Every dotted name an import statement of ``module`` asks for, anywhere in the file.

    ``from x import n`` yields ``x`` and ``x.n`` (``n`` may be a submodule); relative imports are
    resolved against ``module``.
    """
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            yield source
            yield from (f"{source}.{alias.name}" for alias in node.names)


def ancestors(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module → the modules of the same package its imports run (the rule of the docstring)."""
    return graph_of(module_paths(package_dir))


def graph_of(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module → the modules of ``modules`` its imports run (the rule of the docstring)."""
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module, path in modules.items():
        initialising = ancestors(module)
        for name in imported_names(module, path):
            parts = name.split(".")
            for target in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
                if target not in modules or target == module:
                    continue
                if target == name or target not in initialising:
                    graph[module].add(target)
    return graph


def import_closure(graph: Mapping[str, set[str]], start: Iterable[str]) -> set[str]:
    """Every module of ``graph`` that importing each of ``start`` runs: its imports (at any level
    of the file), theirs, and the packages around each (their ``__init__`` runs first)."""
    seen: set[str] = set()
    pending = list(start)
    while pending:
        module = pending.pop()
        if module in seen or module not in graph:
            continue
        seen.add(module)
        pending += graph[module] | ancestors(module)
    return seen
