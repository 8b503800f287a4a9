"""jobbers_celery's layers: every import points to the same or a lower layer, and no file
imports itself back through others.

Read from the source with ``ast``: every ``import`` anywhere in a module counts (module
level, inside functions, under ``TYPE_CHECKING``), so a cycle cannot hide in a function.

    core      pure values and rules (no Redis, no Celery app): states, options, config...
    store     the only code that talks to Redis
    services  what jobbers does with the store: record, publish, clean, schedule, ...
    root      ``Jobbers``, the one composition root that builds the services
    adapter   the Celery side (task class, request, signals, bootsteps, install)

jobbers_django sits above all of them and uses only the public API (``__all__``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "jobbers_celery"
NAME = "jobbers_celery"

LAYERS: dict[str, list[str]] = {
    "core": ["states", "errors", "backoff", "options", "codec", "config", "records", "payload",
             "spool", "softlimit", "redaction", "tracing", "errortext", "intake", "printable",
             "storable"],
    "store": ["store", "store.base", "store.keys", "store.fastcall", "store.redis",
              "store.connect"],
    "services": ["metrics", "aside", "sinks", "results", "recorder", "publisher", "cleaner",
                 "liveness", "pacing", "scheduler", "history"],
    "root": ["jobbers"],
    "adapter": ["shutdown", "beat", "taskrepr", "logfilter", "task", "request", "signals",
                "refusals",
                "runtime",
                "install", "cli.output", "cli.base", "cli.aside", "cli.dlq", "cli", ""],
}
RANK = {f"{NAME}.{m}".rstrip("."): n for n, mods in enumerate(LAYERS.values()) for m in mods}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([NAME, *parts])] = path
    return out


MODULES = _modules()


def _imports(module: str, path: Path) -> set[str]:
    """The package modules ``module`` imports, anywhere in its file."""
    found: set[str] = set()
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
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:  # a name inside a module: the module
                name = name.rpartition(".")[0]
            if name.startswith(NAME) and name != module:
                found.add(name)
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def test_every_module_has_a_layer() -> None:
    assert sorted(set(MODULES) - set(RANK)) == []
    assert sorted(set(RANK) - set(MODULES)) == []  # no stale name in LAYERS


def test_imports_point_to_the_same_or_a_lower_layer() -> None:
    upward = sorted(f"{m} ({_layer(m)}) imports {i} ({_layer(i)})"
                    for m, imported in GRAPH.items() for i in imported if RANK[i] > RANK[m])
    assert upward == []


def test_no_import_cycle_among_the_files() -> None:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for nxt in sorted(GRAPH[module]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert cycles == []


def test_the_reader_sees_imports_inside_functions_and_type_checking_blocks() -> None:
    # the test above would be blind without these
    assert f"{NAME}.task" in GRAPH[f"{NAME}.install"]  # inside a function
    assert f"{NAME}.recorder" in GRAPH[f"{NAME}.cleaner"]  # under TYPE_CHECKING


def _layer(module: str) -> str:
    return list(LAYERS)[RANK[module]]
