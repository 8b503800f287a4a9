"""The jobbers admin in a real browser (headless Chromium): log in, the failure groups with
their charts, a group resubmitted in three clicks, one entry resubmitted from its page, the
live page drawing progress bars and refreshing itself, and the dead-letter list fitting a
1366 px window. Screenshots: ``test-artifacts/screenshots/`` (and the docs' ones)."""

from __future__ import annotations

from typing import Any

import pytest
from selenium.webdriver.common.by import By

from jobbers_celery import TaskState
from jobbers_django.admin import live as live_admin
from jobbers_django.models import DeadLetterEntry, FailureGroup, Status
from tests.browser.conftest import WIDTH, Clicks, wait_for_page
from tests.browser.demo import SECRET, report_progress, seed_dead_letters, seed_records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis]


@pytest.fixture
def demo(djapp: Any) -> dict[str, Any]:
    """The docs' demo data: dead letters in PostgreSQL, records and counts in Redis."""
    shown = seed_dead_letters()
    running = seed_records(djapp.jobbers, shown)
    djapp.jobbers.clean()  # a fresh cleaner pass: the live page does not say "overdue"
    return {"shown": shown, "running": running}


def page_text(driver: Any) -> str:
    return str(driver.find_element(By.TAG_NAME, "body").text)


def row_of(driver: Any, *words: str) -> Any:
    """The changelist row whose text has all of ``words`` (its text as written, whatever
    the lines it wraps into)."""
    return next(r for r in driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
                if all(w in r.get_attribute("textContent") for w in words))


def test_groups_page_draws_each_groups_failures_over_the_last_day(browser, demo, shoot):
    browser.get(f"{browser.base}/admin/jobbers/failuregroup/")
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == FailureGroup.objects.count() == 5
    sparks = browser.find_elements(By.CSS_SELECTOR, "#result_list td.field-last_24h svg")
    assert len(sparks) == 5
    # the supplier outage: 15 failures in the last 24 h, in several hourly bars
    catalog = row_of(browser, "shop.import_catalog", "SupplierTimeout")
    bars = catalog.find_elements(By.CSS_SELECTOR, "svg.jobbers-spark rect")
    assert len(bars) >= 3
    label = catalog.find_element(By.CSS_SELECTOR, "svg.jobbers-spark").get_attribute(
        "aria-label")
    assert label.startswith("15 failures in the last 24 hours")
    assert "Resubmit…" in catalog.text
    assert "Discard…" in catalog.text
    no_scroll(browser)
    shoot("groups", docs=True)


def test_a_group_is_resubmitted_in_three_clicks(browser, demo, shoot, published):
    clicks = Clicks(browser)
    browser.get(f"{browser.base}/admin/jobbers/deadletterentry/")  # where triage starts
    clicks(By.CSS_SELECTOR, ".object-tools a[href$='/failuregroup/']")        # 1
    group = FailureGroup.objects.get(task_name="shop.import_catalog",
                                     exception_type="shop.tasks.SupplierTimeout")
    dead = set(DeadLetterEntry.objects.filter(fingerprint=group.fingerprint, status=Status.DEAD)
               .values_list("task_id", flat=True))
    assert len(dead) == group.dead == 15
    clicks(By.CSS_SELECTOR, f"a[href$='/failuregroup/{group.pk}/resubmit/']")  # 2
    confirm = page_text(browser)
    assert browser.find_element(By.ID, "jobbers-confirm-count").text == "15"
    assert "A sample: the 5 most recent (secrets redacted)" in confirm
    assert "supplier-1.example.com" in confirm
    assert SECRET not in browser.page_source
    assert browser.find_element(By.CSS_SELECTOR, "input[name=version][value=entry]"
                                ).is_selected()
    shoot("resubmit-confirmation", docs=True)
    clicks(By.ID, "jobbers-confirm")                                            # 3
    assert clicks.count == 3
    message = browser.find_element(By.CSS_SELECTOR, ".messagelist .success").text
    assert message == ("Resubmitted 15 dead-letter entries (retry count reset): "
                       "15 published.")
    assert set(published) == dead
    assert not DeadLetterEntry.objects.filter(fingerprint=group.fingerprint,
                                              status=Status.DEAD).exists()
    assert browser.current_url.endswith("/admin/jobbers/failuregroup/")
    shoot("group-resubmitted")


def test_one_entry_is_resubmitted_from_its_page(browser, demo, shoot, published, jobbers):
    entry = DeadLetterEntry.objects.get(task_id=demo["shown"])
    clicks = Clicks(browser)
    browser.get(f"{browser.base}/admin/jobbers/deadletterentry/?task_name=shop.import_catalog")
    clicks(By.CSS_SELECTOR, f"#result_list a[href*='/deadletterentry/{entry.pk}/change/']")  # 1
    detail = page_text(browser)
    assert "Publish pending:\nno" in detail or "Publish pending: no" in detail
    assert "Failure history (2, oldest first)" in detail
    assert SECRET not in browser.page_source
    assert not browser.find_elements(By.CSS_SELECTOR, ".field-publish_pending_display img")
    shoot("detail", docs=True, max_height=3000)
    clicks(By.ID, "jobbers-resubmit")                                           # 2
    assert browser.find_element(By.ID, "jobbers-confirm-count").text == "1"
    assert browser.find_element(By.CSS_SELECTOR, "input[name=version][value=entry]"
                                ).is_selected()  # the demo tasks are not registered here
    clicks(By.CSS_SELECTOR, "button[name=reset_retry_count][value='0']")       # 3
    assert clicks.count == 3
    assert browser.find_element(By.CSS_SELECTOR, ".messagelist .success").text == (
        "Resubmitted 1 dead-letter entry (retry count kept): 1 published.")
    assert published == [entry.task_id]
    assert jobbers.get(entry.task_id).state == TaskState.SUBMITTED
    assert browser.current_url.endswith(f"/deadletterentry/{entry.pk}/change/")


def test_live_page_draws_progress_and_refreshes_itself(browser, demo, shoot, jobbers,
                                                       monkeypatch):
    browser.get(f"{browser.base}/admin/jobbers/deadletterentry/live/")
    bars = browser.find_elements(By.CSS_SELECTOR, "#jobbers-running .jobbers-progress")
    # {"done": 48200, "total": 120000}, {"chunk": 11, "of": 60}, {"batch": 51, "of": 400}:
    # each a bar; the counter 1 is no bar (and no "100%")
    assert sorted(int(b.get_attribute("aria-valuenow")) for b in bars) == [12, 18, 40]
    text = page_text(browser)
    assert "48200 of 120000 done" in text
    assert "chunk 11 of 60" in text
    assert "batch 51 of 400" in text
    assert "100%" not in text
    for label in browser.find_elements(By.CSS_SELECTOR, "#jobbers-running .jobbers-progress-label"):
        assert label.size["height"] < 40, label.text  # never one character per line
    lines = browser.find_elements(By.CSS_SELECTOR, "#jobbers-history svg polyline")
    assert {line.get_attribute("data-state") for line in lines} >= {"started", "completed"}
    shoot("live", docs=True)
    # the task reports more progress: the page shows it without being reloaded
    monkeypatch.setattr(live_admin, "REFRESH_SECONDS", 1)
    browser.get(f"{browser.base}/admin/jobbers/deadletterentry/live/")
    browser.execute_script("window.jobbersNotReloaded = true")
    report_progress(jobbers.store, demo["running"][0], {"done": 108_000, "total": 120_000})

    def updated() -> bool:  # read in one script: the content may be swapped meanwhile
        return "90" in browser.execute_script(
            "return Array.from(document.querySelectorAll('#jobbers-running .jobbers-progress'))"
            ".map(function (b) { return b.getAttribute('aria-valuenow'); })")

    wait_for_page(browser, updated, timeout=20, what="the refreshed progress")
    assert browser.execute_script("return window.jobbersNotReloaded") is True


def test_dead_letter_list_needs_no_horizontal_scrolling_at_1366px(browser, demo, shoot):
    assert browser.execute_script("return window.innerWidth") == WIDTH
    browser.get(f"{browser.base}/admin/jobbers/deadletterentry/")
    headers = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#result_list thead th")]
    for column in ("EXCEPTION", "FAILURES", "LAST FAILED", "STATUS"):
        assert column in headers
    no_scroll(browser)
    status = browser.find_elements(By.CSS_SELECTOR, "#result_list td.field-status")
    assert all(cell.is_displayed() and cell.rect["x"] + cell.rect["width"] <= WIDTH
               for cell in status)
    shoot("changelist", docs=True, max_height=1500)
    browser.get(f"{browser.base}/admin/jobbers/deadletteraudit/")
    assert "1 audit entry" in page_text(browser)


def no_scroll(driver: Any) -> None:
    """Nothing on the page is wider than its box: the page, the list's own scroller."""
    for selector in ("document.documentElement", "document.querySelector('.results')",
                     "document.querySelector('#changelist')"):
        widths = driver.execute_script(
            f"var e = {selector}; return e ? [e.scrollWidth, e.clientWidth] : [0, 0]")
        assert widths[0] <= widths[1], f"{selector}: scrollWidth {widths[0]} > clientWidth " \
                                       f"{widths[1]}"


def test_a_paced_group_resubmit_halts_on_a_spike_of_re_failures(browser, demo, shoot,
                                                                 published):
    """From the groups page: Resubmit…, a pace and a stop rule, Start (two clicks and three
    fields); the run's page shows it live. The cause is not fixed: the first tasks it
    publishes fail again, and the run halts by its rule with most of the group unpublished.
    The steps run here (a worker runs them in production), one at a time."""
    from datetime import timedelta

    from django.utils import timezone

    from jobbers_django import runs
    from jobbers_django.models import ResubmitRun, ResubmitRunItem, RunStatus
    from jobbers_django.sink import write_entry
    from tests.django.conftest import dead_letter

    group = FailureGroup.objects.get(task_name="shop.import_catalog",
                                     exception_type="shop.tasks.SupplierTimeout")
    clicks = Clicks(browser)
    browser.get(f"{browser.base}/admin/jobbers/failuregroup/")
    clicks(By.CSS_SELECTOR, f"a[href$='/failuregroup/{group.pk}/resubmit/']")  # 1
    for name, value in (("rate", "20"), ("halt_after", "2"), ("of_last", "4")):
        field = browser.find_element(By.CSS_SELECTOR, f"#jobbers-paced input[name={name}]")
        field.clear()
        field.send_keys(value)
    clicks(By.ID, "jobbers-paced-start")                                          # 2
    assert clicks.count == 2
    run = ResubmitRun.objects.get()
    assert browser.current_url.endswith(f"/admin/jobbers/resubmitrun/{run.pk}/change/")
    assert (run.total, run.rate, run.halt_after, run.of_last) == (15, 20, 2, 4)

    runs.step(run.pk, run.chain)  # queued -> running, the first task published
    run.refresh_from_db()
    # a quarter of a second at 20 per second is due: a few more
    ResubmitRun.objects.filter(pk=run.pk).update(
        paced_since=timezone.now() - timedelta(seconds=0.25))
    runs.step(run.pk, run.chain)
    run.refresh_from_db()
    sent = list(ResubmitRunItem.objects.filter(run=run, published_at__isnull=False)
                .order_by("position").values_list("task_id", flat=True))
    assert 3 <= len(sent) < run.total
    for task_id in sent:  # the supplier still times out: each fails again
        write_entry(dead_letter(task_id, name="shop.import_catalog", version=2,
                                queue="imports", attempt=5,
                                exception_type="shop.tasks.SupplierTimeout",
                                exception_message="supplier-1.example.com did not answer "
                                                  "within 30s"))
    runs.step(run.pk, run.chain)
    run.refresh_from_db()
    assert run.status == RunStatus.HALTED
    assert run.published == len(sent)
    assert set(published) >= set(sent)
    wait_for_page(browser, lambda: browser.find_element(
        By.ID, "jobbers-run-status").text == "halted", what="the run page to show the halt")
    window = min(len(sent), 4)
    halted = (f"Halted: {window} of the last {window} resubmitted tasks failed again "
              "(the rule: halt when more than 2 of the last 4)")
    # read by the same poll: the live page may replace the element between find and read
    wait_for_page(browser, lambda: browser.find_element(By.ID, "jobbers-run-halt").text
                  == halted, what="the run page to say why it halted")
    print(f"paced group resubmit: 20/s, halt when more than 2 of the last 4 failed again: "
          f"{run.published} of {run.total} published before the halt")
    shoot("paced-halted")
