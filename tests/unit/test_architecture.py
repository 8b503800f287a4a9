"""The core (every module of jobbers_celery/core) imports no Celery, Redis or Django;
checked in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "jobbers_celery"
# every module of core/, read from the folder: a new one is checked without a list to update
PURE = sorted(f"core.{p.stem}" for p in (PACKAGE / "core").glob("*.py") if p.stem != "__init__")


def test_pure_core_imports_only_the_standard_library():
    # cryptography too: the payload codec imports it only once payload keys are set
    # Load the core modules through a bare package object, so that
    # jobbers_celery/__init__.py (which wires Celery) does not run.
    code = (
        "import sys, types\n"
        "pkg = types.ModuleType('jobbers_celery')\n"
        f"pkg.__path__ = [{str(PACKAGE)!r}]\n"
        "sys.modules['jobbers_celery'] = pkg\n"
        + "".join(f"import jobbers_celery.{m}\n" for m in PURE)
        + "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'celery', 'kombu', 'redis', 'django', 'opentelemetry', 'billiard', "
        "'cryptography'})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""


def test_lua_scripts_and_marker_ship_inside_the_package():
    from importlib import resources

    root = resources.files("jobbers_celery")
    assert root.joinpath("py.typed").is_file()
    lua = root.joinpath("store", "lua")
    assert {p.name for p in lua.iterdir() if p.name.endswith(".lua")} >= {
        "_lib.lua", "transition.lua", "complete.lua", "claim.lua", "due.lua", "prune.lua"}
