"""Every repository file that the README, the CHANGELOG, the docs, the docstrings and comments
cite exists.

A reader who follows "see docs/howto/retries.md" or a link to ``bench/README.md`` must land
somewhere. MkDocs' strict build checks the links between docs pages only; this covers the rest:
paths written in prose or code spans (``docs/...``, ``jobbers_celery/...``, ``tests/...``,
...), upper-case top-level documents (``CHANGELOG.md``) and relative Markdown links.
Paths that exist only once something runs (``example_project/var/``, ``.venv/``, ``site/``,
``dist/``, ``__pycache__``) are listed in RUNTIME: the pages that name them say so.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Where citations are read: every Markdown page of the project and every Python module.
SOURCES = sorted({
    ROOT / "README.md", ROOT / "CHANGELOG.md",
     *(ROOT / "docs").rglob("*.md"), *(ROOT / "example_project").rglob("*.md"),
     *(ROOT / "bench").rglob("*.md"),
     *(p for top in ("jobbers_celery", "jobbers_django", "tests", "bench", "example_project",
                     "scripts", "docs/_ext")
       for p in (ROOT / top).rglob("*.py")),
     *(p for p in (ROOT / "scripts").iterdir() if p.is_file()), ROOT / ".ci" / "run"},
)

#: Created by running something (the example, the venv bootstrap, the docs build, a build).
RUNTIME = {"example_project/var", ".venv", "site", "dist"}
#: Named as gone ("replaces scripts/demo"), in the CHANGELOG's history.
REMOVED = {"scripts/demo"}

TOP = ("docs", "jobbers_celery", "jobbers_django", "tests", "scripts", "bench",
       "example_project", ".ci")
# a path under one of the repository's top-level folders, e.g. docs/howto/retries.md#anchor
TREE_PATH = re.compile(
    r"(?<![\w./<-])((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w./*-]*[\w/*])")
# an upper-case top-level document (README.md, CHANGELOG.md, ...) or a top-level config file
TOP_FILE = re.compile(r"(?<![\w./-])([A-Z][A-Z_]+\.md|pyproject\.toml|mkdocs\.yml)(?![\w-])")
# a relative Markdown link target: [text](target) or [text](target#anchor)
MD_LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s#]+)")


def cited(text: str) -> set[str]:
    found = {m.group(1) for m in TREE_PATH.finditer(text)}
    found |= {m.group(1) for m in TOP_FILE.finditer(text)}
    return {f.rstrip("/.") or f for f in found}


def missing_in(source: Path) -> list[str]:
    text = source.read_text(errors="replace")
    missing = []
    for path in sorted(cited(text)):
        if (path in RUNTIME | REMOVED or any(path.startswith(r + "/") for r in RUNTIME)
                or "__pycache__" in path):
            continue
        if not ((ROOT / path).exists() if "*" not in path else any(ROOT.glob(path))):
            missing.append(path)
    if source.suffix == ".md":
        for target in sorted({m.group(1) for m in MD_LINK.finditer(text)}):
            if not (source.parent / target).exists():
                missing.append(f"link {target}")
    return missing


def test_the_sources_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in SOURCES}
    assert {"README.md", "CHANGELOG.md", "docs/quickstart-celery.md",
            "jobbers_celery/core/backoff.py", "tests/conftest.py"} <= names


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_cited_path_exists(source: Path) -> None:
    assert missing_in(source) == [], f"{source.relative_to(ROOT)} cites files that do not exist"


def test_the_check_sees_a_missing_file(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    gone = "DESIGN" + ".md"  # not spelled out, so that this file cites nothing missing
    nowhere = "docs/howto/" + "nowhere.md"
    page.write_text(f"See {gone} section 3, `{nowhere}#x`, [a](../nothing.md), "
                    "[b](https://example.com/x.md), docs/img/admin-*.png and "
                    "docs/howto/retries.md.\n")
    assert missing_in(page) == [gone, nowhere, "link ../nothing.md"]
