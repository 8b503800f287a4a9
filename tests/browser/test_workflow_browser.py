"""The workflow page in a real browser (headless Chromium, 1400 px wide), on canvases a real
worker ran (``dj_worker``: tests.django.celery_app, the Django sink): a chord whose header
member failed into the DLQ, reached in one click from that member's task page, its member
highlighted, repaired with Resubmit failed members (the callback then runs, the page follows
it live); and a completed chain. Screenshots: ``test-artifacts/screenshots/`` and, with
``JOBBERS_DOCS_SCREENSHOTS=1``, ``docs/img/admin-workflow-*.png``."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from celery import chain, chord
from django.urls import reverse
from selenium.webdriver.common.by import By

from jobbers_django.models import DeadLetterEntry, Status
from tests.browser.conftest import HEIGHT, Clicks, wait_for_page
from tests.conftest import wait_for
from tests.django.conftest import dj_worker, dj_worker_args  # noqa: F401  (shared)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis,
              pytest.mark.worker]

#: The docs' screenshots of the workflow page are this wide.
WIDE = 1400


def _flag(redis_url: str, key: str) -> None:
    """What an operator fixes: ``djproj.flaky_import(key)`` succeeds from now on."""
    client = redis.Redis.from_url(redis_url)
    client.set(key, "fixed")
    client.close()


def _state(jobbers: Any, task_id: str, state: str) -> None:
    def reached() -> bool:
        flow = jobbers.workflow(task_id)
        return flow is not None and flow.state.value == state
    wait_for(reached, timeout=30, message=f"the workflow of {task_id} to be {state}")


def text_of(browser: Any, element_id: str) -> str:
    return str(browser.find_element(By.ID, element_id).text)


def test_a_chord_held_by_a_failed_member_is_repaired_from_its_page(
        browser, djapp, jobbers, dj_worker, shoot, redis_url):  # noqa: F811
    browser.set_window_size(WIDE, HEIGHT)
    fine, broken = f"wf-fine-{uuid.uuid4().hex[:6]}", f"wf-broken-{uuid.uuid4().hex[:6]}"
    _flag(redis_url, fine)
    header = [djapp.flaky_import.s(fine), djapp.flaky_import.s(broken),
              djapp.flaky_import.s(fine)]
    ids = [str(uuid.uuid4()) for _ in header]
    for sig, task_id in zip(header, ids, strict=True):
        sig.set(task_id=task_id)
    result = chord(header)(djapp.collect.s())
    failed = ids[1]
    _state(jobbers, ids[0], "failed")
    wait_for(lambda: DeadLetterEntry.objects.filter(task_id=failed).exists(), timeout=30,
             message="the failed member's dead letter")

    clicks = Clicks(browser)
    browser.get(browser.base + reverse("admin:jobbers_task", args=[failed]))
    clicks(By.ID, "jobbers-task-workflow")                                         # 1
    assert text_of(browser, "jobbers-wf-state") == "failed"
    assert text_of(browser, "jobbers-wf-progress") == "2 of 3 completed, 1 failed, 0 running"
    assert failed in text_of(browser, "jobbers-wf-blocking")
    rows = browser.find_elements(By.CSS_SELECTOR, "#jobbers-wf-members tbody tr")
    assert [r.get_attribute("data-state") for r in rows].count("completed") == 2
    (blocking,) = browser.find_elements(By.CSS_SELECTOR, "tr.jobbers-blocking")
    assert blocking.get_attribute("data-task-id") == failed
    assert "ValueError" in blocking.text
    assert browser.execute_script("return document.documentElement.scrollWidth") <= WIDE
    shoot("workflow-chord-failed", docs=True)

    _flag(redis_url, broken)  # the cause fixed, then the failed member resubmitted
    clicks(By.ID, "jobbers-wf-resubmit")                                           # 2
    confirm = browser.find_element(By.ID, "content-main").text
    assert "Resubmit the failed members of workflow" in confirm
    assert failed in confirm.split("Members to resubmit")[1]
    shoot("workflow-resubmit-confirmation")
    clicks(By.ID, "jobbers-confirm")                                               # 3
    assert clicks.count == 3
    message = browser.find_element(By.CSS_SELECTOR, ".messagelist .success").text
    assert message == f"Workflow of {failed}: 1 member resubmitted (retry count reset)."
    assert DeadLetterEntry.objects.get(task_id=failed).status == Status.RESUBMITTED
    # the callback runs: Celery's result backend has the chord's result, and the page,
    # refreshing itself while the workflow runs, shows it completed
    assert result.get(timeout=30, follow_parents=False) == 3
    wait_for_page(browser, lambda: text_of(browser, "jobbers-wf-state") == "completed",
                  timeout=30, what="the workflow page to show the chord completed")
    assert text_of(browser, "jobbers-wf-progress") == "4 of 4 completed, 0 failed, 0 running"
    roles = {r.get_attribute("data-task-id"): r.find_elements(By.TAG_NAME, "td")[2].text
             for r in browser.find_elements(By.CSS_SELECTOR, "#jobbers-wf-members tbody tr")}
    assert roles[result.id] == "callback"
    assert not browser.find_elements(By.CSS_SELECTOR, "tr.jobbers-blocking")
    history = text_of(browser, "jobbers-wf-history")
    assert "resubmitted" in history
    assert "completed" in history.splitlines()[-1]
    shoot("workflow-chord-repaired", docs=True)


def test_a_completed_chain(browser, djapp, jobbers, dj_worker, shoot, redis_url):  # noqa: F811
    browser.set_window_size(WIDE, HEIGHT)
    key = f"wf-chain-{uuid.uuid4().hex[:6]}"
    _flag(redis_url, key)
    result = chain(*(djapp.flaky_import.si(key) for _ in range(4)),
                   djapp.collect.si([1, 2, 3])).apply_async()
    assert result.get(timeout=30) == 3
    _state(jobbers, result.id, "completed")
    browser.get(browser.base + reverse("admin:jobbers_workflow", args=[result.id]))
    assert text_of(browser, "jobbers-wf-state") == "completed"
    assert text_of(browser, "jobbers-wf-progress") == "5 of 5 completed, 0 failed, 0 running"
    assert text_of(browser, "jobbers-wf-blocking") == "-"
    rows = browser.find_elements(By.CSS_SELECTOR, "#jobbers-wf-members tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[2].text for r in rows] == [
        "root", "member", "member", "member", "member"]
    assert not browser.find_elements(By.ID, "jobbers-refresh-on")  # ended: no refresh
    assert not browser.find_elements(By.ID, "jobbers-wf-cancel")
    assert not browser.find_elements(By.ID, "jobbers-wf-resubmit")
    # each member links to its task page
    last = reverse("admin:jobbers_task", args=[result.id])
    browser.find_element(By.CSS_SELECTOR, f"#jobbers-wf-members a[href$='{last}']")
    shoot("workflow-chain", docs=True)
