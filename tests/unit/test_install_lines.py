"""Every install line in README.md and docs/ is one the tests run.

jobbers is not on PyPI, so ``pip install jobbers`` (or ``"jobbers[otel]"``) cannot work: a
page may only name the forms below, each run by a test from an empty venv. A new form fails
here until a test runs it and it is added to TESTED; a third-party package needs a reason in
THIRD_PARTY.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

#: the arguments of an install line -> the test that runs exactly that install
TESTED = {
    "/path/to/jobbers": "tests/distribution/test_quickstart_celery.py (the page's line, from the checkout)",
    "/path/to/jobbers[django]": "tests/distribution/test_quickstart_django.py (the page's line, from the "
                                "checkout); tests/distribution/test_bare_install.py (the wheel's extra)",
    "/path/to/jobbers[otel]": "tests/distribution/test_bare_install.py (the wheel's "
                              "[django,otel,crypto])",
    "/path/to/jobbers[crypto]": "tests/distribution/test_bare_install.py (the wheel's "
                                "[django,otel,crypto]: a value sealed and opened)",
}
#: packages from PyPI that a page installs for a tool of its own, not jobbers
THIRD_PARTY = {"selenium": "docs/howto/dlq-admin.md: scripts/admin_screenshots.py drives Chromium",
               "pytest": "docs/howto/testing.md: the reader's test runner "
                         "(tests/distribution/test_howto_testing.py installs it)"}

INSTALL = re.compile(r"\bpip3?\s+install\s+([^`\n#]+)")


def install_lines() -> list[tuple[str, int, str]]:
    found = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for m in INSTALL.finditer(line):
                found.append((page.relative_to(ROOT).as_posix(), n, m.group(1).strip()))
    return found


def test_install_lines_are_found() -> None:
    pages = {page for page, _, _ in install_lines()}
    assert {"README.md", "docs/quickstart-celery.md", "docs/quickstart-django.md",
            "docs/howto/metrics.md"} <= pages


@pytest.mark.parametrize(("page", "line", "args"), install_lines(),
                         ids=[f"{p}:{n}" for p, n, _ in install_lines()])
def test_every_install_line_is_tested(page: str, line: int, args: str) -> None:
    words = shlex.split(args)
    if words and all(w in THIRD_PARTY for w in words):
        return
    assert words in ([form] for form in TESTED), (
        f"{page}:{line}: `pip install {args}` is not a form the tests run: one of {list(TESTED)}")


def test_the_tested_forms_are_run() -> None:
    """The quickstart tests run their pages' lines, with /path/to/jobbers made this checkout;
    the bare-install test installs the wheel and its extras."""
    dist = ROOT / "tests" / "distribution"
    for test in ("test_quickstart_celery.py", "test_quickstart_django.py"):
        assert 'Substitution("/path/to/jobbers", str(ROOT)' in (dist / test).read_text()
    bare = (dist / "test_bare_install.py").read_text()
    assert '"install", str(dist.wheel)' in bare
    assert '[django,otel,crypto]"' in bare
    celery_page = (ROOT / "docs" / "quickstart-celery.md").read_text()
    django_page = (ROOT / "docs" / "quickstart-django.md").read_text()
    assert "\npip install /path/to/jobbers\n" in celery_page
    assert '\npip install "/path/to/jobbers[django]"\n' in django_page
