"""Retake the screenshots of docs/howto/dlq-admin.md from the browser tests.

The browser tests (tests/browser) log in to the jobbers admin in headless Chromium with the
docs' demo data (tests/browser/demo.py), check each page and take its screenshot into
``test-artifacts/screenshots/``; with ``JOBBERS_DOCS_SCREENSHOTS=1``, which this script
sets, the pages the docs show are also written to ``docs/img/admin-*.png``. So the docs show
exactly what the tests checked. Run from the repository root after changing the admin:

    .venv/bin/python scripts/admin_screenshots.py [pytest arguments]

It needs what the tests need (``scripts/test`` sets it up): Debian's ``chromium`` and
``chromium-driver``, ``redis-server`` and PostgreSQL on 127.0.0.1:5432.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    env = {**os.environ, "JOBBERS_DOCS_SCREENSHOTS": "1"}
    return subprocess.call([sys.executable, "-m", "pytest", "tests/browser", "-q",
                            *sys.argv[1:]], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
