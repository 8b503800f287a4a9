"""Fixtures of the distribution tests: one build of the sdist and the wheel per session, from
a copy of the checkout that holds every kind of local state a working checkout accumulates
(what ``scripts/example``, the venv bootstrap and the docs build leave behind), and a private
redis-server per test. Logs of a failed test are attached to its report."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.conftest import ROOT, RedisServer
from tests.distribution.tools import Dist, build, copy_tree

#: Local state planted in the copy before the build: none of it may reach the sdist.
LOCAL_STATE = {
    "example_project/var/admin-password": "s3cret-admin-password\n",
    "example_project/var/db.sqlite3": "SQLite format 3\0",
    "example_project/var/db.sqlite3-wal": "",
    "example_project/var/celerybeat-schedule.dat": "",
    "example_project/var/logs/worker-imports-a.log": "[INFO] ready.\n",
    ".venv/bin/python": "",
    ".venv/pyvenv.cfg": "home = /usr/bin\n",
    "site/index.html": "<html></html>\n",
    "dist/jobbers-0.0.1-py3-none-any.whl": "",
    "jobbers_celery/__pycache__/states.cpython-311.pyc": "",
    "db.sqlite3": "SQLite format 3\0",
    "celerybeat-schedule": "",
    "worker.log": "",
}


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """The sdist and the wheel, built as a release would be (``python -m build``)."""
    work = tmp_path_factory.mktemp("dist")
    tree = work / "checkout"
    copy_tree(ROOT, tree)
    for name, content in LOCAL_STATE.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(content)
    started = time.monotonic()
    built = build(tree, work / "out", log=work / "build.log")
    print(f"built the sdist and the wheel in {time.monotonic() - started:.1f}s")
    return built


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own (the pages use database 0, which the session's
    server leaves to nobody in particular)."""
    server = RedisServer()
    yield server
    server.stop()
