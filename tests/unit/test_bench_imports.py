"""Every name the benchmarks import from the two packages still exists where they import it.

The benchmarks (``bench/``) reach into internals (the cleaner, liveness, payload, the store)
and import most of them inside functions, so a module moved in the package leaves them
importable and fails only when someone runs one, minutes into it. Nothing else runs them:
this reads every ``from jobbers_celery... import ...`` / ``from jobbers_django... import``
of ``bench/`` (at any depth of the code) and resolves each name.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
PACKAGES = ("jobbers_celery", "jobbers_django")


def imported_names() -> list[tuple[str, str, str]]:
    """(file, module, name) of every import of the packages in bench/ (name "" for
    ``import module``)."""
    out = []
    for path in sorted(BENCH.rglob("*.py")):
        where = path.relative_to(BENCH.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                    and node.module.split(".")[0] in PACKAGES):
                out += [(where, node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                out += [(where, alias.name, "") for alias in node.names
                        if alias.name.split(".")[0] in PACKAGES]
    return out


def test_the_benchmarks_imports_are_found() -> None:
    found = {(f, m) for f, m, _n in imported_names()}
    assert ("bench/cleaner_parts/passes.py", "jobbers_celery.lifecycle.cleaner") in found
    assert any(f.startswith("bench/dlq_parts/") for f, _m in found)


@pytest.mark.parametrize(("where", "module", "name"), imported_names(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_name_the_benchmarks_import_exists(where: str, module: str, name: str) -> None:
    mod = importlib.import_module(module)
    if name and not hasattr(mod, name):
        importlib.import_module(f"{module}.{name}")  # a submodule (from a.b import c)
