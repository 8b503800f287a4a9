"""docs/quickstart-celery.md, run as written from an empty directory.

Its shell lines make a venv and install jobbers from the checkout into it; ``proj.py`` is
written from the page's file blocks; the worker and beat start as real processes from that
venv; the page's Python session is played in ``python`` next to ``proj.py`` and every output
compared with the page's (``...`` stands for what differs between machines). Where the page
says the reader waits ("a moment later"), the step is re-run until it matches, within 60 s.

The test's only changes to the page (each must still be needed, or the test fails):
* ``/path/to/jobbers`` is this checkout: the page cannot know where the reader's is;
* ``127.0.0.1:6379`` is the test's own redis-server: the machine's shared Redis is never
  touched by tests.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, RedisServer
from tests.distribution.pages import Page, Substitution

pytestmark = [pytest.mark.worker, pytest.mark.timeout(900)]

PAGE = ROOT / "docs" / "quickstart-celery.md"


def test_the_celery_quickstart_works_as_written(tmp_path: Path, own_redis: RedisServer) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    page = Page(
        PAGE, workdir, logs=tmp_path,
        substitutions=[
            Substitution("/path/to/jobbers", str(ROOT), "the reader's checkout"),
            Substitution("127.0.0.1:6379", f"127.0.0.1:{own_redis.port}",
                         "the test's own redis-server"),
        ],
        services={r"celery -A proj worker": " ready.", r"celery -A proj beat": "Starting..."},
        shell="python",
    )
    started = time.monotonic()
    try:
        page.run()
    finally:
        page.stop()
    print(f"{PAGE.name} in {time.monotonic() - started:.1f}s:",
          "; ".join(f"{c} {t:.1f}s" for c, t in page.timings))
