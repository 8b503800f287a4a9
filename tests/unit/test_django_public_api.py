"""``jobbers_django`` uses ``jobbers_celery``'s public API alone: every import of it, read
from the source (module level, inside functions, under ``TYPE_CHECKING``), is
``from jobbers_celery import <a name of jobbers_celery.__all__>``. No submodule is imported
(so no attribute of one, such as ``records.from_ms``, is reached), no module path is named
to an importer, and no part of a ``Jobbers`` (its ``store`` and the like) is reached through
an object called ``jobbers``. Nor does it import redis-py: Redis failing reaches it as
``jobbers_celery.StoreUnavailable``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import jobbers_celery

ROOT = Path(__file__).resolve().parents[2]
DJANGO_APP = ROOT / "jobbers_django"
PUBLIC = frozenset(jobbers_celery.__all__)
#: What ``Jobbers`` is documented to expose as attributes; its other attributes are parts.
#: ``alerts``: the alert service (``jobbers.alerts.emit``, docs/howto/alerts.md).
PUBLIC_ATTRIBUTES = frozenset({"app", "config", "alerts"})


def jobbers_parts() -> frozenset[str]:
    """The attributes ``Jobbers.__init__`` and ``compose`` set that are not documented API
    (both are its base's, :class:`~jobbers_celery.composition.Composition`)."""
    tree = ast.parse((ROOT / "jobbers_celery" / "composition.py").read_text())
    cls = next(node for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef) and node.name == "Composition")
    assigned = {target.attr for node in ast.walk(cls) if isinstance(node, ast.FunctionDef)
                and node.name in ("__init__", "compose") for stmt in ast.walk(node)
                if isinstance(stmt, ast.Assign | ast.AnnAssign)
                for target in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                and target.value.id == "self" and not target.attr.startswith("_")}
    return frozenset(assigned - PUBLIC_ATTRIBUTES)


def _is_jobbers_celery(module: str) -> bool:
    return module == "jobbers_celery" or module.startswith("jobbers_celery.")


def _is_redis(module: str) -> bool:
    return module == "redis" or module.startswith("redis.")


def _names_jobbers(node: ast.expr) -> bool:
    """``jobbers``, ``self.jobbers``, ``get_jobbers()``, ``services.get_jobbers()``..."""
    if isinstance(node, ast.Call):
        node = node.func
    name = (node.id if isinstance(node, ast.Name)
            else node.attr if isinstance(node, ast.Attribute) else "")
    return "jobbers" in name.lower()


def violations(source: str, where: str, parts: frozenset[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{line}: import {alias.name}" for alias in node.names
                      if _is_jobbers_celery(alias.name) or _is_redis(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("jobbers_celery.") or _is_redis(node.module):
                found.append(f"{line}: from {node.module} import ...")
            elif node.module == "jobbers_celery":
                found += [f"{line}: from jobbers_celery import {alias.name} (not in __all__)"
                          for alias in node.names if alias.name not in PUBLIC]
        elif isinstance(node, ast.Call):
            # importlib.import_module("jobbers_celery.x"), symbol_by_name("jobbers_celery.x:y")
            found += [f"{line}: names the module {arg.value!r}" for arg in node.args
                      if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                      and arg.value.startswith("jobbers_celery.")
                      and arg.value.split(".")[1].split(":")[0] not in PUBLIC]
        elif (isinstance(node, ast.Attribute) and node.attr in parts
              and _names_jobbers(node.value)):
            found.append(f"{line}: reaches Jobbers.{node.attr}, a part, not the API")
    return found


def test_jobbers_django_imports_only_public_names() -> None:
    parts = jobbers_parts()
    assert "store" in parts  # the test reads Jobbers.__init__ as it is
    found = []
    for path in sorted(DJANGO_APP.rglob("*.py")):
        found += violations(path.read_text(), str(path.relative_to(ROOT)), parts)
    assert not found, "jobbers_django reaches past jobbers_celery's public API:\n" + \
        "\n".join(found)


@pytest.mark.parametrize("source", [
    "from jobbers_celery.core.records import from_ms",
    "def f():\n    from jobbers_celery.lifecycle.cleaner import CleanerStatus",
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    from jobbers_celery.core.records import DeadLetter"),
    "import jobbers_celery",
    "import jobbers_celery.core.records as records",
    "from jobbers_celery import records",
    "from jobbers_celery import TaskState, install, RedisStore",
    "from jobbers_celery import *",
    "import importlib\nimportlib.import_module('jobbers_celery.store')",
    "def f(jobbers):\n    return jobbers.store.now_ms()",
    "def f():\n    return services.get_jobbers().store.client",
    "def f(self):\n    return self.jobbers.dead_letters",
    "import redis",
    "def f():\n    from redis.exceptions import ConnectionError",
])
def test_the_check_catches(source: str) -> None:
    assert violations(source, "example", jobbers_parts())


@pytest.mark.parametrize("source", [
    "from jobbers_celery import TaskState, StoreUnavailable, DeadLetter",
    "def f(jobbers):\n    return jobbers.now(), jobbers.config.retention, jobbers.app",
    "from jobbers_django.models import DeadLetterEntry\nfrom . import conf",
    "def f(overview):\n    return overview.cleaner",
])
def test_the_check_lets_public_use_pass(source: str) -> None:
    assert violations(source, "example", jobbers_parts()) == []
