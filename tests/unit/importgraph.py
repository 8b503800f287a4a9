"""A package's import graph, read from its source with ``ast`` (for the layer tests).

Every ``import`` anywhere in a module counts: module level, inside functions, under
``TYPE_CHECKING``, so neither a cycle nor a forbidden package can hide in a function.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ImportGraph:
    #: dotted module name -> its file (a package is named by its ``__init__.py``)
    modules: dict[str, Path]
    #: module -> the package's modules it imports
    graph: dict[str, set[str]]
    #: module -> the third-party top-level packages it imports
    third: dict[str, set[str]]


def modules_of(package: Path, name: str) -> dict[str, Path]:
    out = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([name, *parts])] = path
    return out


def imports_of(module: str, path: Path, name: str,
               modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """The package modules and the third-party packages ``module`` imports, anywhere."""
    found: set[str] = set()
    third: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = module.split(".")
                anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            # ``from pkg import mod`` imports the module ``pkg.mod`` when there is one
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                     for a in node.names]
        else:
            continue
        for imported in names:
            top = imported.split(".")[0]
            if top != name:
                if top not in sys.stdlib_module_names and top != "__future__":
                    third.add(top)
                continue
            while imported and imported not in modules:  # a name inside a module
                imported = imported.rpartition(".")[0]
            if imported and imported != module:
                found.add(imported)
    return found, third


def read(package: Path, name: str) -> ImportGraph:
    modules = modules_of(package, name)
    read_ = {m: imports_of(m, p, name, modules) for m, p in modules.items()}
    return ImportGraph(modules, {m: f for m, (f, _) in read_.items()},
                       {m: t for m, (_, t) in read_.items()})


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import cycle found by a depth-first walk, as the path that closes it."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for nxt in sorted(graph[module]):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found
