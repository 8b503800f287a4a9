"""docs/howto/testing.md, run as its reader runs it: from an empty directory, in an empty venv.

The page's shell lines make the venv and install what the page says (jobbers from the built
wheel, pytest), its files are written as their titles say, and its two suites run with that
venv's ``python -m pytest``, as the page's own commands: the in-memory one with no Redis to
reach, the other with Celery's pytest fixtures against the test's own redis-server. The
checkout is not importable (no ``PYTHONPATH``): jobbers comes from the wheel alone. One venv
serves both suites.

The test's only changes to the page (each must still be needed, or the test fails):
* ``/path/to/jobbers`` is the built wheel: the page cannot know where the reader's checkout is;
* ``redis://localhost:6379/15`` is the test's own redis-server: tests never touch the shared
  Redis.
The in-memory suite runs with ``REDIS_URL`` (which the page's ``myapp/tasks.py`` reads) naming
a port where nothing listens, so that only the fakes can make it pass.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import pytest

from tests.conftest import ROOT, RedisServer, free_port
from tests.distribution.markdown import blocks
from tests.distribution.pages import Page, Substitution
from tests.distribution.tools import Dist, run, user_env

pytestmark = [pytest.mark.worker, pytest.mark.timeout(900)]

PAGE = ROOT / "docs" / "howto" / "testing.md"
#: The page's command that runs a suite: ``[VAR=value ...] python -m pytest <folder>``
RUN_SUITE = re.compile(r"^(?:\S+=\S+\s+)*python -m pytest (?P<folder>\S+)$")
#: Each suite's bound: the page's waits are 10 s each, a hung worker must not hang the test
SUITE_TIMEOUT = 300
PAGE_REDIS_URL = "redis://localhost:6379/15"


@dataclass
class Reader:
    """The reader's directory once the page's install lines ran and its files were written."""

    page: Page
    titles: list[str] = field(default_factory=list)
    #: folder -> the page's command that runs its suite
    suites: dict[str, str] = field(default_factory=dict)

    def pytest(self, command: str, extra: dict[str, str]) -> str:
        """``command`` in the page's shell (its venv activated), as the reader types it."""
        started = time.monotonic()
        out = run(["bash", "-c", "\n".join([*self.page.prelude, command])],
                  cwd=self.page.workdir, log=self.page.logs / "suites.log",
                  env=user_env(extra), timeout=SUITE_TIMEOUT)
        print(f"`{command}` in {time.monotonic() - started:.1f}s")
        return out


@pytest.fixture(scope="module")
def reader(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Reader:
    logs = tmp_path_factory.mktemp("howto-testing")
    workdir = logs / "project"
    workdir.mkdir()
    page = Page(PAGE, workdir, logs=logs,
                substitutions=[Substitution("/path/to/jobbers", str(dist.wheel),
                                            "the built wheel")],
                services={}, shell="python")
    reader = Reader(page)
    started = time.monotonic()
    for block in blocks(PAGE):
        if block.lang == "sh":
            for line, command in block.commands():
                m = RUN_SUITE.match(command)
                if m:
                    reader.suites[m["folder"]] = command
                else:
                    page.command(page.substitute(command), f"{PAGE.name} line {line}")
        elif block.lang == "python" and block.title:
            page.write(block)
            reader.titles.append(block.file[0])
        elif block.lang == "toml":
            # the pyproject.toml way of enabling Celery's plugin; the conftest's
            # ``pytest_plugins`` line, which the suite runs with, is the other
            assert block.text == '[tool.pytest.ini_options]\naddopts = ["-p", "celery.contrib.pytest"]\n'
        else:
            raise AssertionError(f"{page.where(block)}: the test does not know how to run a "
                                 f"{block.lang!r} block")
    unused = [s.old for s in page.substitutions if not s.used]
    assert unused == [], f"substitutions the page no longer needs: {unused}"
    print(f"installed and written in {time.monotonic() - started:.1f}s")
    return reader


def test_the_page_writes_both_suites_and_says_how_to_run_them(reader: Reader) -> None:
    assert set(reader.titles) == {
        "myapp/tasks.py", "tests_memory/conftest.py", "tests_memory/test_tasks.py",
        "tests_redis/conftest.py", "tests_redis/test_tasks.py"}
    assert set(reader.suites) == {"tests_memory", "tests_redis"}


def test_the_in_memory_examples_pass_without_redis(reader: Reader) -> None:
    # nothing listens there: the fakes must be all the tests use
    out = reader.pytest(reader.suites["tests_memory"],
                        {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    assert "4 passed" in out, out


def test_the_celery_fixture_examples_pass_on_redis(reader: Reader,
                                                   own_redis: RedisServer) -> None:
    command = reader.suites["tests_redis"]
    assert PAGE_REDIS_URL in command, f"the page no longer runs the suite on {PAGE_REDIS_URL}"
    out = reader.pytest(command.replace(PAGE_REDIS_URL, f"redis://127.0.0.1:{own_redis.port}/15"),
                        {})
    assert "2 passed" in out, out
