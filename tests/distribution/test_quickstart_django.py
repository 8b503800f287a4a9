"""docs/quickstart-django.md, run as written from an empty directory.

Its shell lines make a venv, install jobbers with its ``django`` extra from the checkout,
run ``startproject`` and ``startapp``; the files are written or extended from the page's
blocks; ``migrate`` and ``createsuperuser`` run (the password typed at its prompts, on a
terminal of its own); the web server, a worker and beat start as real processes from that
venv; the page's session is played in ``python manage.py shell`` and must show the task's
dead letter in the database; the page's ``curl`` must list it; and the admin pages the page
names must show it to the admin logged in with that password.

The test's only changes to the page (each must still be needed, or the test fails):
* ``/path/to/jobbers`` is this checkout: the page cannot know where the reader's is;
* ``127.0.0.1:6379`` is the test's own redis-server: tests never touch the shared Redis;
* ``runserver`` listens on a free port instead of 8000, which another process may hold, and
  the page's ``127.0.0.1:8000`` follows it;
* ``YOUR-PASSWORD`` is the password typed at ``createsuperuser``'s prompts.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import shutil
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, RedisServer, free_port, wait_for
from tests.distribution.pages import Page, Substitution

pytestmark = [pytest.mark.worker, pytest.mark.timeout(900)]

PAGE = ROOT / "docs" / "quickstart-django.md"
PASSWORD = "Quickstart-admin-pw-7"


class Browser:
    """Django admin as a browser sees it: a session cookie, the login form's CSRF token."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=30) as answer:
            return str(answer.read().decode())

    def log_in(self, username: str, password: str) -> None:
        form = self.get("/admin/login/?next=/admin/")
        m = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        assert m, "no CSRF token in the admin's login form"
        data = urllib.parse.urlencode({"csrfmiddlewaretoken": m[1], "username": username,
                                       "password": password, "next": "/admin/"}).encode()
        request = urllib.request.Request(self.base + "/admin/login/?next=/admin/", data=data,
                                         headers={"Referer": self.base + "/admin/login/"})
        with self.opener.open(request, timeout=30) as answer:
            assert answer.url.endswith("/admin/"), "the admin refused the password"


def test_the_django_quickstart_works_as_written(tmp_path: Path, own_redis: RedisServer) -> None:
    if shutil.which("curl") is None:
        pytest.fail("curl is not installed (apt-get install curl); the page uses it",
                    pytrace=False)
    workdir = tmp_path / "project"
    workdir.mkdir()
    port = free_port()
    page = Page(
        PAGE, workdir, logs=tmp_path,
        substitutions=[
            Substitution("/path/to/jobbers", str(ROOT), "the reader's checkout"),
            Substitution("127.0.0.1:6379", f"127.0.0.1:{own_redis.port}",
                         "the test's own redis-server"),
            Substitution("manage.py runserver", f"manage.py runserver 127.0.0.1:{port}",
                         "a free port: 8000 may be taken"),
            Substitution("127.0.0.1:8000", f"127.0.0.1:{port}", "that port"),
            Substitution("YOUR-PASSWORD", PASSWORD, "the password typed at createsuperuser"),
        ],
        services={r"manage\.py runserver": "Quit the server with",
                  r"celery -A proj worker": " ready.",
                  r"celery -A proj beat": "Starting..."},
        shell="python manage.py shell",
        answers={r"createsuperuser": [PASSWORD, PASSWORD]},
    )
    started = time.monotonic()
    try:
        page.run()
        command, out = page.outputs[-1]
        assert command.startswith("curl ")
        listing = json.loads(out)
        assert listing["count"] == 1
        (entry,) = listing["results"]
        assert (entry["task_name"], entry["reason"], entry["exception_type"]) == (
            "shop.tasks.sync_orders", "failed", "shop.tasks.ShopUnavailable")

        browser = Browser(f"http://127.0.0.1:{port}")
        browser.log_in("admin", PASSWORD)
        assert "Dead-letter entries" in browser.get("/admin/jobbers/")
        wait_for(lambda: "shop.tasks.sync_orders" in browser.get("/admin/jobbers/deadletterentry/"),
                 timeout=10, message="the dead letter in the admin's list")
    finally:
        page.stop()
    print(f"{PAGE.name} in {time.monotonic() - started:.1f}s:",
          "; ".join(f"{c} {t:.1f}s" for c, t in page.timings))
