"""Fixtures of the browser tests: headless Chromium driven by selenium against pytest-django's
``live_server`` (the jobbers_django test settings, PostgreSQL, the session's private Redis).

Chromium and its driver are Debian's ``chromium`` and ``chromium-driver`` (``scripts/test``
installs them when missing). Missing, the tests fail, never skip. Screenshots go to
``test-artifacts/screenshots/`` (git-ignored); with ``JOBBERS_DOCS_SCREENSHOTS=1``
(``scripts/admin_screenshots.py``) the docs' ones are also written to ``docs/img/``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.django.conftest import djapp, jobbers, operator, published  # noqa: F401  (shared)

SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
DOCS_IMG = ROOT / "docs" / "img"
#: The narrowest window the admin must fit without horizontal scrolling (a common laptop).
WIDTH = 1366
HEIGHT = 900
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--disable-dev-shm-usage"]


def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(f"{' or '.join(names)} not found: the browser tests need Debian's chromium and "
                "chromium-driver (apt-get install -y chromium chromium-driver; scripts/test "
                "installs them)", pytrace=False)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A socket left for the garbage collector (a redis-py or kombu connection in a reference
    cycle, whose socket's finalizer can run before the connection's own ``__del__`` closes
    it) is reported in whichever test's collection frees it, and Selenium's allocations make
    the browser tests the ones whose collections do: once in each of three clean-clone runs,
    a different test each time, never in isolation, not after a full collection before the
    browser modules. In the browser tests that report says nothing about the test, so it
    is not an error there; everywhere else it still is."""
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(pytest.mark.filterwarnings("ignore::ResourceWarning"))


@pytest.fixture(scope="session")
def driver() -> Iterator[Any]:
    """One headless Chromium for the session (a window of 1366 x 900)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _binary("chromium", "chromium-browser")
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="jobbers-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={WIDTH},{HEIGHT}")
    browser = webdriver.Chrome(options=options,
                               service=Service(_binary("chromedriver")))
    browser.set_page_load_timeout(30)
    try:
        yield browser
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)


class Clicks:
    """Clicks the operator makes, counted (the issue asks for three)."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.count = 0

    def __call__(self, by: str, value: str) -> None:
        from selenium.webdriver.support import expected_conditions as ec
        from selenium.webdriver.support.ui import WebDriverWait

        element = WebDriverWait(self.driver, 10).until(ec.element_to_be_clickable((by, value)))
        old = self.driver.find_element("tag name", "html")
        navigates = (element.tag_name in ("a", "button")
                     or element.get_attribute("type") == "submit")
        element.click()
        self.count += 1
        if navigates:
            WebDriverWait(self.driver, 15).until(ec.staleness_of(old))  # the next page


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.jobbers_failed = report.failed  # type: ignore[attr-defined]
    return report


@pytest.fixture
def browser(request: pytest.FixtureRequest, driver: Any, live_server: Any,
            operator: Any, djapp: Any) -> Iterator[Any]:  # noqa: F811
    """The session's browser, logged in as ``operator`` (resubmit, discard, cancel), at the
    admin's index, with Django's navigation sidebar OPEN (its default, as operators see the
    pages: every page must fit beside it). A failed test leaves
    ``test-artifacts/screenshots/FAILED-<test>.png``."""

    driver.set_window_size(WIDTH, HEIGHT)
    login(driver, live_server.url, "operator")
    open_sidebar(driver)
    driver.base = live_server.url
    yield driver
    if getattr(request.node, "jobbers_failed", False):
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SCREENSHOTS / f"FAILED-{request.node.name}.png"))


def open_sidebar(driver: Any) -> None:
    """Django's navigation sidebar open on every page after this one (Django's own default;
    a test never folds it away to make room)."""
    driver.execute_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'true')")


def login(driver: Any, base: str, username: str, password: str = "pw") -> None:
    """Log ``username`` in to the admin at ``base``, from a blank page: a request the last
    test's page still had in flight (a live page refreshing itself) could otherwise set a
    new CSRF cookie after the login form was drawn with the old token, and the login was
    refused (403: CSRF token incorrect; twice in clean-clone runs)."""
    from selenium.webdriver.common.by import By

    driver.get("about:blank")
    driver.delete_all_cookies()
    driver.get(f"{base}/admin/login/")
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for_page(driver, lambda: "Site administration" in driver.title)


def wait_for_page(driver: Any, check: Callable[[], bool], timeout: float = 15,
                  what: str = "the page") -> None:
    """Poll ``check`` until it holds (a deadline, never a fixed sleep). An element the page
    replaced between finding and reading it (a live page refreshing its parts) is a
    check that does not hold yet, read again at the next poll."""
    from selenium.common.exceptions import StaleElementReferenceException

    def holds() -> bool:
        try:
            return check()
        except StaleElementReferenceException:
            return False

    deadline = time.monotonic() + timeout
    while not holds():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} ({driver.current_url})")
        time.sleep(0.1)


@pytest.fixture
def shoot(driver: Any) -> Callable[..., Path]:
    """``shoot(name, docs=False)``: a screenshot of the whole page (the window grown to its
    height, at most ``max_height``) in ``test-artifacts/screenshots/<name>.png``; with
    ``docs`` and ``JOBBERS_DOCS_SCREENSHOTS=1`` also ``admin-<name>.png`` in ``docs/img/``."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(name: str, *, docs: bool = False, max_height: int = 2400) -> Path:
        width = driver.get_window_size()["width"]
        for _ in range(3):  # the inner height is less than the window's: grow until it fits
            height = driver.execute_script("return document.documentElement.scrollHeight")
            inner = driver.execute_script("return window.innerHeight")
            if inner >= min(height, max_height):
                break
            size = driver.get_window_size()
            driver.set_window_size(width, min(size["height"] + height - inner, max_height + 200))
            wait_for_page(driver, lambda: driver.execute_script(
                "return document.readyState") == "complete")
        path = SCREENSHOTS / f"{name}.png"
        driver.save_screenshot(str(path))
        if docs and os.environ.get("JOBBERS_DOCS_SCREENSHOTS") == "1":
            shutil.copyfile(path, DOCS_IMG / f"admin-{name}.png")
        driver.set_window_size(width, HEIGHT)
        return path

    return take
