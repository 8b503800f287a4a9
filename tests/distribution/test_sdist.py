"""What the sdist and the wheel contain.

The sdist is built from a copy of the checkout holding every kind of local state
(``LOCAL_STATE`` in conftest: the example's admin password, SQLite database and logs, a venv,
the docs site, old builds, caches): it must ship the sources and the licence, and none of
that. The wheel holds the two packages with their data files (Lua scripts, templates,
migrations, ``py.typed``) and the licence, and declares ``celery[redis]``.
"""

from __future__ import annotations

import fnmatch
import tomllib
import zipfile

import pytest

from tests.conftest import ROOT
from tests.distribution.conftest import LOCAL_STATE
from tests.distribution.tools import Dist

pytestmark = pytest.mark.timeout(600)

#: Never in an sdist, whatever the checkout holds.
FORBIDDEN = ["example_project/var/*", ".venv/*", "site/*", "dist/*", "*.sqlite3*", "*.log",
             "*__pycache__*", "*.pyc", "*celerybeat-schedule*", ".git/*"]


def source_files(top: str, suffixes: tuple[str, ...]) -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / top).rglob("*")
            if p.is_file() and p.suffix in suffixes and "__pycache__" not in p.parts}


def test_the_sdist_ships_no_local_state(dist: Dist) -> None:
    names = dist.sdist_names()
    leaked = sorted(n for n in names if any(fnmatch.fnmatch(n, pat) for pat in FORBIDDEN))
    assert leaked == []
    assert not set(LOCAL_STATE) & set(names)


def test_the_sdist_ships_the_sources_and_the_licence(dist: Dist) -> None:
    names = set(dist.sdist_names())
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "mkdocs.yml",
            "scripts/test", ".ci/run", "example_project/manage.py",
            "example_project/.gitignore"} <= names
    for top in ("jobbers_celery", "jobbers_django", "tests", "docs"):
        missing = source_files(top, (".py", ".lua", ".html", ".md", ".typed")) - names
        assert missing == set(), f"the sdist lacks files of {top}/"


def test_the_licence_is_the_declared_one() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    text = (ROOT / "LICENSE").read_text()
    assert declared == "MIT"
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the jobbers authors" in text
    assert "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND" in text


def test_the_wheel_holds_the_packages_their_data_and_the_licence(dist: Dist) -> None:
    with zipfile.ZipFile(dist.wheel) as whl:
        names = set(whl.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = whl.read(info).decode()
        entry_points = whl.read(info.replace("METADATA", "entry_points.txt")).decode()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops - {info.split("/", 1)[0]} == {"jobbers_celery", "jobbers_django"}
    expected = (source_files("jobbers_celery", (".py", ".lua", ".typed"))
                | source_files("jobbers_django", (".py", ".html", ".typed")))
    assert expected - names == set()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: MIT" in metadata.splitlines()
    # kombu's Redis transport imports `packaging`, declared only in kombu's `redis` extra
    assert any(line.startswith("Requires-Dist: celery[redis]") for line in metadata.splitlines())
    # `celery -A proj jobbers ...`: Celery finds its sub-commands through this entry point
    assert "[celery.commands]\njobbers = jobbers_celery.cli:jobbers" in entry_points
