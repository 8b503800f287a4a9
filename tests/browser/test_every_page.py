"""Every jobbers admin page in a real browser, at 1024 and 1400 px wide with Django's
navigation sidebar open (its default): the page never scrolls sideways, every action button
is on screen (not behind a sideways scroll of its table), and axe-core finds no serious or
critical violation. The pages are found from the admin's URL patterns (tests/browser/pages.py),
so a page added later is checked too; one needing an object gets it from the demo data below
(a new kind of object: add its value to ``values``). Screenshots of every page at both
widths: ``test-artifacts/screenshots/page-<name>-<width>.png``; axe's counts per page:
``test-artifacts/axe-<width>.json``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.apps import apps
from django.contrib.admin.models import ADDITION, LogEntry
from django.contrib.contenttypes.models import ContentType

from jobbers_celery import AlertKind
from jobbers_celery.deadletter.aside import SetAsideList
from jobbers_django import runs, services
from jobbers_django.models import AlertRule
from tests.browser.conftest import SCREENSHOTS, login, open_sidebar, wait_for_page
from tests.browser.demo import seed_dead_letters, seed_records
from tests.browser.pages import (
    BLOCKING,
    axe_source,
    axe_violations,
    fit_problems,
    jobbers_pages,
    other_time_formats,
    sidebar_open,
    write_report,
)
from tests.django.conftest import dead_letter
from tests.django.workflow_helpers import FakeWorkflows, chord_workflow

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis]

WIDTHS = (1024, 1400)
HEIGHT = 900


@pytest.fixture
def world(djapp: Any, published: Any, monkeypatch: pytest.MonkeyPatch,
          django_user_model: Any) -> dict[str, Any]:
    """The docs' demo data, a paced resubmit, a workflow (the chord of the workflow tests,
    answered for any id), an alert rule with a line of change history, and a superuser
    (who sees every page and every button) so that every page has something to show."""
    shown = seed_dead_letters()
    seed_records(djapp.jobbers, shown)
    djapp.jobbers.clean()
    run = runs.start(services.Selection(filters={"task_name": "shop.sync_inventory"}, limit=3),
                     runs.Pace(rate=2.0, halt_after=2, of_last=4))
    rule = AlertRule.objects.create(name="new-groups", kind=AlertKind.NEW_FAILURE_GROUP.value,
                                    task="shop.*", emails="oncall@example.com")
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    LogEntry.objects.create(  # the rule's change history has a line (its time shown)
        user=root, content_type=ContentType.objects.get_for_model(AlertRule),
        object_id=str(rule.pk), object_repr=str(rule), action_flag=ADDITION,
        change_message="Added.")
    SetAsideList(djapp.jobbers.store).add(  # the set-aside page lists one
        '{"task_id": "refused-1"}', "the sink refused it: DataError (value too long)",
        "outbox", dead_letter("refused-1"))
    fake = FakeWorkflows(chord_workflow())
    monkeypatch.setattr(djapp.jobbers, "workflow", fake.workflow)
    return {"shown": shown, "run": run}


def _values(world: dict[str, Any]) -> dict[str, Callable[[str], str | None]]:
    """An argument's value by its name (given the URL's name)."""

    def first_of(url_name: str) -> str | None:
        # jobbers_<model>_<view>: the first object of that model
        model = url_name.removeprefix("jobbers_").rsplit("_", 1)[0]
        try:
            found = apps.get_model("jobbers", model).objects.order_by("pk").first()
        except LookupError:
            return None
        if model == "deadletterentry":
            found = apps.get_model("jobbers", model).objects.get(task_id=world["shown"])
        return None if found is None else str(found.pk)

    return {
        "object_id": first_of,
        "pk": first_of,
        "run_id": lambda _: str(world["run"].pk),
        "task_id": lambda _: world["shown"],
        "control": lambda _: "pause",
    }


def _login_superuser(driver: Any, base: str) -> None:
    """As the fixtures' superuser (each page's own permission granted)."""

    login(driver, base, "root")
    open_sidebar(driver)


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_fits_with_the_sidebar_open_and_passes_axe(
        width: int, driver: Any, live_server: Any, world: dict[str, Any], shoot: Any,
        client: Any, django_user_model: Any) -> None:
    _login_superuser(driver, live_server.url)
    client.force_login(django_user_model.objects.get(username="root"))
    pages, missing = jobbers_pages(_values(world))
    axe = axe_source()
    driver.set_window_size(width, HEIGHT)
    assert driver.execute_script("return window.innerWidth") == width
    problems = [f"a page the fixtures give no object: {m}" for m in missing]
    report: dict[str, Any] = {}
    checked = []
    for page in pages:
        try:
            status = client.get(page.path).status_code  # POST-only endpoints are no pages
        except Exception as exc:  # noqa: BLE001  (every page's failure, in one report)
            problems.append(f"{page.name} {page.path}: raised {exc!r}")
            continue
        if status in (302, 403, 405):  # an action's endpoint (POST only, or back to its
            continue                     # page), or add/delete on a read-only admin
        if status != 200:
            problems.append(f"{page.name} {page.path}: answered {status}")
            continue
        driver.get(live_server.url + page.path)
        wait_for_page(driver, lambda: driver.execute_script(
            "return document.readyState") == "complete")
        checked.append(page.name)
        if not sidebar_open(driver):
            problems.append(f"{page.name}: the navigation sidebar is not open")
        problems += [f"{page.name} at {width}px: {p}" for p in fit_problems(driver)]
        problems += [f"{page.name}: a time not in the one format: {t!r}"
                     for t in other_time_formats(driver)]
        found = axe_violations(driver, axe)
        report[page.name] = {"path": page.path,
                             "impacts": dict(Counter(v["impact"] or "none" for v in found)),
                             "violations": found}
        problems += [f"{page.name} at {width}px: axe {v['impact']} {v['id']} ({v['help']}; "
                     f"{v['nodes']} nodes: {', '.join(v['targets'])})"
                     for v in found if v["impact"] in BLOCKING]
        shoot(f"page-{page.name.removeprefix('jobbers_')}-{width}", max_height=3000)
    write_report(SCREENSHOTS.parent / f"axe-{width}.json", report)
    assert len(checked) >= 10, checked  # the discovery found the pages
    assert not problems, "\n".join(problems)
