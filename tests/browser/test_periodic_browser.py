"""The periodic tasks page in a real browser, filled (schedules missed, late and
overlapping, a hostile name, runs of each), at 1024 and 1400 px with Django's sidebar open:
it never scrolls sideways, its times read in the one format, and axe-core finds no serious
or critical violation. Screenshots: ``test-artifacts/screenshots/periodic-<width>.png``."""

from __future__ import annotations

from typing import Any

import pytest

from jobbers_celery.lifecycle.periodic import ScheduleInfo
from tests.browser.conftest import login, open_sidebar, wait_for_page
from tests.browser.pages import (
    BLOCKING,
    axe_source,
    axe_violations,
    fit_problems,
    other_time_formats,
    sidebar_open,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis]


def _fill(jobbers: Any) -> None:
    watch = jobbers.periodic
    infos = [
        ScheduleInfo.of("jobbers.clean", "jobbers.clean", "<freq: 10.00 seconds>", 10_000,
                        10_000),
        ScheduleInfo.of("reports.nightly-warehouse-inventory-reconciliation-for-every-region",
                        "shop.reports.reconcile_inventory_for_all_warehouses",
                        "<crontab: 0 4 * * * (m/h/dM/MY/d)>", 86_400_000, -60_000),
        ScheduleInfo.of("sync <b>\x1b[2J</b>", "shop.sync", "<freq: 1.00 minute>", 60_000,
                        60_000),
    ]
    watch.learn(infos, "beat", beat="beat@ops-1")
    clean, _, sync = infos
    for n in range(6):
        watch.published(clean, f"clean-{n}-5f0c2a9e-7d41-4a8e-9a51-1c7d2b3e4f50",
                        -20_000 if n == 2 else 0)
        watch.started("jobbers.clean", f"clean-{n}-5f0c2a9e-7d41-4a8e-9a51-1c7d2b3e4f50",
                      "jobbers.clean")
        if n != 4:
            watch.ended("jobbers.clean", f"clean-{n}-5f0c2a9e-7d41-4a8e-9a51-1c7d2b3e4f50",
                        "SUCCESS")
    # clean-4 ran until after clean-5 started: clean-5 is overlapping
    watch.ended("jobbers.clean", "clean-4-5f0c2a9e-7d41-4a8e-9a51-1c7d2b3e4f50", "SUCCESS")
    watch.published(sync, "sync-1", 0)
    watch.judge()


@pytest.mark.parametrize("width", [1024, 1400])
def test_the_periodic_page_fits_and_passes_axe(width: int, driver: Any, live_server: Any,
                                               jobbers: Any, shoot: Any,
                                               django_user_model: Any) -> None:
    from django.urls import reverse
    from selenium.webdriver.common.by import By

    _fill(jobbers)
    django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    login(driver, live_server.url, "root")
    open_sidebar(driver)
    driver.set_window_size(width, 900)
    driver.get(live_server.url + reverse("admin:jobbers_periodic"))
    wait_for_page(driver, lambda: driver.execute_script(
        "return document.readyState") == "complete")
    text = driver.find_element(By.ID, "content").text
    assert "reports.nightly-warehouse" in text
    assert "sync <b>\\x1b[2J</b>" in text  # shown as text, escaped
    assert sidebar_open(driver)
    problems = [*fit_problems(driver), *other_time_formats(driver)]
    problems += [f"axe {v['impact']} {v['id']} ({v['help']})"
                 for v in axe_violations(driver, axe_source()) if v["impact"] in BLOCKING]
    shoot(f"periodic-{width}", max_height=3000)
    assert not problems, "\n".join(map(str, problems))
