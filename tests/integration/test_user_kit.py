"""docs/howto/testing.md runs as its reader runs it: its files are written to an empty
directory and its tests run there with pytest, in a process of their own (the page's own
pytest options, Celery's plugin enabled as the page says), once without Redis on the
in-memory fakes and once against the session's private Redis with Celery's fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, subprocess_env
from tests.distribution.markdown import blocks

PAGE = ROOT / "docs" / "howto" / "testing.md"


def _write(workdir: Path) -> list[str]:
    """Write the page's titled Python files under ``workdir``; their titles."""
    titles = []
    for block in blocks(PAGE):
        if block.lang == "python" and block.title:
            path, append = block.file
            target = workdir / path
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("a" if append else "w") as f:
                f.write(block.text)
            titles.append(path)
    (workdir / "myapp" / "__init__.py").touch()
    return titles


def _pytest(workdir: Path, folder: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    # this checkout's jobbers, whatever the environment has installed
    env = subprocess_env({"REDIS_URL": redis_url,
                          "PYTHONPATH": os.pathsep.join((str(workdir), str(ROOT)))})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "--timeout", "60", "--rootdir", str(workdir), folder],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=240, check=False)


def test_the_page_writes_both_suites(tmp_path: Path) -> None:
    assert set(_write(tmp_path)) == {
        "myapp/tasks.py", "tests_memory/conftest.py", "tests_memory/test_tasks.py",
        "tests_redis/conftest.py", "tests_redis/test_tasks.py"}


def test_the_in_memory_examples_pass_without_redis(tmp_path: Path) -> None:
    _write(tmp_path)
    # nothing listens there: the fakes must be all the tests use
    done = _pytest(tmp_path, "tests_memory", f"redis://127.0.0.1:{free_port()}/0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout


@pytest.mark.redis
def test_the_celery_fixture_examples_pass_on_redis(tmp_path: Path, redis_url: str) -> None:
    _write(tmp_path)
    done = _pytest(tmp_path, "tests_redis", redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
