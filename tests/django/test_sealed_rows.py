"""Secrets at rest in the Django sink (``jobbers_payload_keys``), on PostgreSQL: a dead
letter's row holds its arguments sealed; the admin and the API show "encrypted" in a process
without the key and the redacted values in one that holds it; a resubmit from the Django side
is refused without the key (the row stays dead, the reason says why) and carries the real
values with it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse

from jobbers_celery import ENCRYPTED, REDACTED, PayloadCodec
from jobbers_celery.core.codec import new_key
from jobbers_celery.deadletter.entry import dead_letter_entry
from jobbers_celery.lifecycle import payload as pl
from jobbers_celery.store import StepResult
from jobbers_django import services
from jobbers_django.models import DeadLetterEntry, Status
from tests.django.api_helpers import API, login

pytestmark = pytest.mark.django_db

KEY = new_key("dj-k1")
PASSWORD = "pw-hunter2-sealed"
NOTE = "note-visible-with-the-key-4711"


def _hold(jobbers: Any, monkeypatch: pytest.MonkeyPatch, keys: list[str]) -> PayloadCodec:
    """This process's Jobbers with ``keys`` (as if ``jobbers_payload_keys`` said so)."""
    codec = PayloadCodec.of(keys)
    monkeypatch.setattr(jobbers, "config",
                        dataclasses.replace(jobbers.config, payload_keys=tuple(keys)))
    for part in (jobbers, jobbers.recorder, jobbers.publisher):
        monkeypatch.setattr(part, "codec", codec)
    return codec


@pytest.fixture
def sealed_id(jobbers: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A failure dead-lettered by a worker holding the key, through the real Django sink;
    this process holds no key afterwards."""
    with monkeypatch.context() as m:
        codec = _hold(jobbers, m, [KEY])
        msg = pl.dumps({"args": ["catalog-42"], "kwargs": {"password": PASSWORD, "note": NOTE},
                        "options": {"queue": "celery"}})
        entry = dead_letter_entry(
            task_id="sealed-1", name="djproj.flaky_import", reason="failed",
            result=StepResult(applied=True, previous="started", now_ms=1_790_000_000_000,
                              attempt=1),
            raw={"msg": msg, "ver": "1", "queue": "celery"}, codec=codec)
        jobbers.sink.write(entry)
    return "sealed-1"


@pytest.fixture
def sent(djapp: Any) -> Iterator[list[Any]]:
    """The bodies of the task messages published while the test runs."""
    from celery.signals import before_task_publish

    bodies: list[Any] = []

    def record(body: Any = None, **_: Any) -> None:
        bodies.append(body)

    before_task_publish.connect(record, weak=False)
    yield bodies
    before_task_publish.disconnect(record)


def test_the_dead_letter_row_holds_the_arguments_sealed(sealed_id):
    row = DeadLetterEntry.objects.get(task_id=sealed_id)
    assert row.args == []
    assert row.kwargs["kid"] == "dj-k1"
    with connection.cursor() as cursor:  # what PostgreSQL keeps, every column
        cursor.execute(f"SELECT * FROM {DeadLetterEntry._meta.db_table} WHERE task_id = %s",
                       [sealed_id])
        stored = json.dumps([str(v) for v in cursor.fetchone()])
    assert PASSWORD not in stored
    assert NOTE not in stored


def _pages(client: Any, sealed_id: str) -> tuple[str, str]:
    row = DeadLetterEntry.objects.get(task_id=sealed_id)
    api = client.get(f"{API}/dead-letter-queue").content.decode()
    admin = client.get(reverse("admin:jobbers_deadletterentry_change", args=[row.pk]))
    assert admin.status_code == 200
    return api, admin.content.decode()


def test_without_the_key_the_admin_and_the_api_show_encrypted(sealed_id, staff):
    for page in _pages(login(staff), sealed_id):
        assert ENCRYPTED in page
        assert NOTE not in page
        assert PASSWORD not in page


def test_manage_py_jobbers_dlq_shows_encrypted_without_the_key_and_values_with_it(
        sealed_id, jobbers, monkeypatch):
    import io

    from django.core.management import call_command

    def show() -> str:
        out = io.StringIO()
        call_command("jobbers_dlq", "show", sealed_id, "--json", stdout=out)
        return out.getvalue()

    without = show()
    assert ENCRYPTED in without
    assert NOTE not in without
    _hold(jobbers, monkeypatch, [KEY])
    held = show()
    assert NOTE in held
    assert PASSWORD not in held


def test_with_the_key_they_show_the_values_redacted(sealed_id, staff, jobbers, monkeypatch):
    _hold(jobbers, monkeypatch, [new_key("dj-k2"), KEY])  # rotated: the old key still opens
    api, admin = _pages(login(staff), sealed_id)
    [shown] = [e for e in json.loads(api)["results"] if e["task_id"] == sealed_id]
    assert shown["args"] == ["catalog-42"]
    assert shown["kwargs"] == {"password": REDACTED, "note": NOTE}
    assert NOTE in admin
    assert PASSWORD not in api
    assert PASSWORD not in admin
    assert ENCRYPTED not in admin


def test_a_resubmit_without_the_key_is_refused_and_the_row_stays_dead(sealed_id, committed,
                                                                      sent):
    result = committed(services.resubmit, services.Selection(task_ids=(sealed_id,)))
    assert result.acted == []
    [skipped] = result.skipped
    assert "encrypted with payload key 'dj-k1'" in skipped["why"]
    assert DeadLetterEntry.objects.get(task_id=sealed_id).status == Status.DEAD
    assert sent == []


def test_a_resubmit_with_the_key_publishes_the_real_values(sealed_id, committed, sent,
                                                           jobbers, monkeypatch):
    _hold(jobbers, monkeypatch, [KEY])
    result = committed(services.resubmit, services.Selection(task_ids=(sealed_id,)))
    assert result.published == [sealed_id]
    [(args, kwargs, _)] = sent
    assert (args, kwargs) == (["catalog-42"], {"password": PASSWORD, "note": NOTE})


def test_a_paced_run_stepped_without_the_key_skips_the_entry_and_leaves_it_dead(
        sealed_id, committed, sent, jobbers, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    from jobbers_django import runs
    from jobbers_django.models import ResubmitRun

    with monkeypatch.context() as m:  # started where the key is held
        _hold(jobbers, m, [KEY])
        run = runs.start(services.Selection(task_ids=(sealed_id,)), runs.Pace(10))
    for _ in range(2):  # stepped by a worker without it
        ResubmitRun.objects.filter(pk=run.pk).update(
            paced_since=timezone.now() - timedelta(minutes=1))
        committed(runs.step, run.pk, run.chain)
    run.refresh_from_db()
    assert (run.published, run.skipped) == (0, 1)
    assert DeadLetterEntry.objects.get(task_id=sealed_id).status == Status.DEAD
    assert sent == []


def test_an_altered_row_is_not_claimed_even_where_its_key_is_held(sealed_id, committed, sent,
                                                                 jobbers, monkeypatch):
    row = DeadLetterEntry.objects.get(task_id=sealed_id)
    data = row.kwargs["data"]
    flipped = ("B" if data[20] == "A" else "A")
    DeadLetterEntry.objects.filter(pk=row.pk).update(
        kwargs={**row.kwargs, "data": data[:20] + flipped + data[21:]})
    _hold(jobbers, monkeypatch, [KEY])
    result = committed(services.resubmit, services.Selection(task_ids=(sealed_id,)))
    assert result.acted == []
    [skipped] = result.skipped
    assert "altered" in skipped["why"]
    assert DeadLetterEntry.objects.get(task_id=sealed_id).status == Status.DEAD
    assert sent == []


@pytest.fixture
def unstorable_id(jobbers: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A dead letter sealed by a worker holding the key, its arguments holding what no store
    takes (NaN, Infinity, NUL, a lone surrogate): sealed raw, so only the seal is stored."""
    with monkeypatch.context() as m:
        codec = _hold(jobbers, m, [KEY])
        msg = pl.dumps({"args": [float("nan"), float("inf"), float("-inf"), "nul\x00x",
                                 "\ud800"],
                        "kwargs": {"k": float("nan")}, "options": {"queue": "celery"}})
        entry = dead_letter_entry(
            task_id="sealed-nan", name="djproj.flaky_import", reason="failed",
            result=StepResult(applied=True, previous="started", now_ms=1_790_000_000_000,
                              attempt=1),
            raw={"msg": msg, "ver": "1", "queue": "celery"}, codec=codec)
        jobbers.sink.write(entry)
    return "sealed-nan"


def test_opened_values_no_store_takes_are_shown_in_the_storable_form(
        unstorable_id, operator, jobbers, monkeypatch):
    from tests.django.api_helpers import post

    _hold(jobbers, monkeypatch, [KEY])
    client = login(operator)
    # the second positional parameter is the task's ``password``: redacted after opening
    shown_args = ["NaN", REDACTED, "-Infinity", "nul\\u0000x", "\\ud800"]
    listed = client.get(f"{API}/dead-letter-queue")
    assert listed.status_code == 200, listed.content
    [entry] = [e for e in listed.json()["results"] if e["task_id"] == unstorable_id]
    assert (entry["args"], entry["kwargs"]) == (shown_args, {"k": "NaN"})
    detail = client.get(f"{API}/tasks/{unstorable_id}")
    assert detail.status_code == 200, detail.content
    assert detail.json()["dead_letter"]["args"] == shown_args
    row = DeadLetterEntry.objects.get(task_id=unstorable_id)
    admin = client.get(reverse("admin:jobbers_deadletterentry_change", args=[row.pk]))
    assert admin.status_code == 200
    page = admin.content.decode()
    assert "&quot;NaN&quot;" in page
    assert "&quot;nul\\\\u0000x&quot;" in page  # the storable form, as JSON
    for live in (reverse("admin:jobbers_live"),
                 reverse("admin:jobbers_task", args=[unstorable_id])):
        assert client.get(live).status_code == 200
    dry = post(client, "dead-letter-queue/resubmit",
               {"task_ids": [unstorable_id], "dry_run": True})
    assert dry.status_code == 200, dry.content
    [sample] = dry.json()["sample"]
    assert (sample["args"], sample["kwargs"]) == (shown_args, {"k": "NaN"})
