"""The Django sink on PostgreSQL never blocks on a hostile dead letter: each poison case of
issue 24 is stored visibly altered, an entry the database still refuses is set aside where
the admin, the API and ``manage.py jobbers_dlq set-aside`` show it, and every entry behind
it is written (through the outbox drain as through a direct write)."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.core.management import call_command

from jobbers_celery import ALTERED, DeadLetter
from jobbers_celery.deadletter.dispatcher import DeadLetterDispatcher
from jobbers_django.models import DeadLetterEntry, DeadLetterFailure, FailureGroup
from jobbers_django.services import to_dead_letter
from jobbers_django.sink import DjangoDeadLetterSink
from tests.django.api_helpers import API, login
from tests.django.conftest import dead_letter

pytestmark = pytest.mark.django_db

SECRET = "hunter2"  # the conftest entry's kwargs password


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


#: Every case the issue measured, and a few more of the same kind.
POISON: dict[str, dict[str, Any]] = {
    "nan": {"args": [float("nan")]},
    "infinity": {"kwargs": {"rate": float("inf"), "floor": -float("inf")}},
    "nul": {"args": ["a\x00b"], "exception_message": "NUL \x00 in the message",
            "traceback": "Traceback\x00"},
    "surrogate": {"args": ["\ud800"], "kwargs": {"k\udfff": 1},
                  "exception_message": "lone \ud83d"},
    "long-id": {"task_id": "i" * 300},
    "long-name": {"name": "n" * 300},
    "long-queue": {"queue": "q" * 256},
    "long-worker": {"worker": "w" * 1000},
    "long-exception-type": {"exception_type": "builtins." + "E" * 300},
    "deep": {"args": [_nested(950)]},
    "deeper": {"checkpoint": _nested(20_000)},
    "big-counts": {"retry_attempt": 2**40, "version": 2**40},
    "options": {"options": {"headers": {"x": "\x00", "y": float("nan")}}},
}


def _poison(case: str) -> DeadLetter:
    fields = dict(POISON[case])
    task_id = fields.pop("task_id", f"poison-{case}")
    return dead_letter(task_id, **fields)


class _Flaky:
    """The real sink, or an outage while ``down``."""

    def __init__(self) -> None:
        self.inner = DjangoDeadLetterSink()
        self.down = True

    def write(self, entry: DeadLetter) -> None:
        if self.down:
            raise ConnectionError("could not connect to server")
        self.inner.write(entry)


@pytest.mark.parametrize("case", sorted(POISON))
def test_each_poison_case_is_stored_visibly_altered_and_the_next_entry_too(case: str) -> None:
    sink = DjangoDeadLetterSink()
    entry = _poison(case)
    sink.write(entry)
    normal = dead_letter()
    sink.write(normal)
    row = DeadLetterEntry.objects.get(task_id=storable_id(entry))
    assert DeadLetterEntry.objects.filter(task_id=normal.task_id).exists()
    stored = to_dead_letter(row)
    assert stored.altered  # what was altered is said
    assert row.options[ALTERED]["fields"] == list(stored.altered)
    if {"args", "kwargs", "checkpoint", "options", "task_id", "name", "queue",
            "version"} & set(stored.altered):
        assert stored.unpublishable  # a resubmit would run it with values it never had
    assert DeadLetterFailure.objects.filter(entry=row).count() == 1
    assert FailureGroup.objects.filter(fingerprint=row.fingerprint).exists()
    assert ALTERED not in to_dead_letter(DeadLetterEntry.objects.get(
        task_id=normal.task_id)).options  # a normal entry is stored as it is


def storable_id(entry: DeadLetter) -> str:
    from jobbers_celery import storable_form

    return storable_form(entry).task_id


def test_values_are_altered_visibly() -> None:
    sink = DjangoDeadLetterSink()
    for case in ("nan", "infinity", "nul", "surrogate", "long-id"):
        sink.write(_poison(case))
    rows = {r.task_id: r for r in DeadLetterEntry.objects.all()}
    assert rows["poison-nan"].args == ["NaN"]
    assert rows["poison-infinity"].kwargs == {"rate": "Infinity", "floor": "-Infinity"}
    assert rows["poison-nul"].args == ["a\\u0000b"]
    assert rows["poison-nul"].exception_message == "NUL \\u0000 in the message"
    assert rows["poison-surrogate"].kwargs == {"k\\udfff": 1}
    [long_id] = [r for r in rows.values() if r.task_id.startswith("iii")]
    assert len(long_id.task_id) == 255
    assert long_id.options[ALTERED]["full"]["task_id"] == "i" * 300


def test_the_outbox_drain_writes_every_entry_parked_behind_poison(jobbers) -> None:
    sink = _Flaky()
    dispatcher = DeadLetterDispatcher(sink, jobbers.store)
    parked = [e for case in sorted(POISON) for e in (_poison(case), dead_letter())]
    for entry in parked:
        assert dispatcher.send(entry) is False  # the database is down: all wait, in order
    outbox = jobbers.store.keys.dead_letter_outbox
    assert jobbers.store.client.llen(outbox) == len(parked)
    assert dispatcher.retry_pending(limit=1000) == 0
    assert DeadLetterEntry.objects.count() == 0

    sink.down = False
    assert dispatcher.retry_pending(limit=1000) == len(parked)  # before: 0 of them
    assert DeadLetterEntry.objects.count() == len(parked)
    assert jobbers.store.client.llen(outbox) == 0
    assert jobbers.set_aside().total == 0


def _refused(task_id: str = "refused-row") -> DeadLetter:
    """A row PostgreSQL refuses whatever its storable form: a reason longer than its
    column (``varchar(16)``); no publisher chooses it, but a custom code path could."""
    return dead_letter(task_id, reason="stalled-while-shutting-down-for-good")


def test_a_row_the_database_still_refuses_is_set_aside_and_shown(jobbers, staff, outsider
                                                                 ) -> None:
    sink = _Flaky()
    dispatcher = DeadLetterDispatcher(sink, jobbers.store)
    behind = [dead_letter() for _ in range(3)]
    for entry in [_refused(), *behind]:
        dispatcher.send(entry)
    sink.down = False
    assert dispatcher.retry_pending() == 3
    assert set(DeadLetterEntry.objects.values_list("task_id", flat=True)) == {
        e.task_id for e in behind}
    report = jobbers.set_aside()
    [item] = report.entries
    assert (item.task_id, item.attempt, item.source) == ("refused-row", 1, "outbox")
    assert "DataError" in item.why or "refused" in item.why
    assert SECRET not in item.why

    # the API (read permission), the admin page, the management command
    response = login(staff).get(f"{API}/dead-letter-queue/set-aside")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["kept"], body["total"]) == (1, 1)
    assert body["results"][0]["task_id"] == "refused-row"
    assert body["results"][0]["waited_in"] == "outbox"
    assert SECRET not in response.content.decode()  # never the arguments
    assert login(outsider).get(f"{API}/dead-letter-queue/set-aside").status_code == 403
    assert login(staff).get(f"{API}/dead-letter-queue/set-aside?limit=0").status_code == 400

    page = login(staff).get("/admin/jobbers/deadletterentry/set-aside/")
    assert page.status_code == 200
    assert "refused-row" in page.content.decode()
    assert SECRET not in page.content.decode()
    assert login(outsider).get("/admin/jobbers/deadletterentry/set-aside/").status_code in (
        302, 403)

    out = io.StringIO()
    call_command("jobbers_dlq", "set-aside", stdout=out)
    assert "refused-row" in out.getvalue()
    assert "1 set aside" in out.getvalue()
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", out.getvalue())  # the one format
    out = io.StringIO()
    call_command("jobbers_dlq", "set-aside", "--json", stdout=out)
    [shown] = json.loads(out.getvalue())["results"]
    assert shown["task_id"] == "refused-row"
    assert shown["at"] == body["results"][0]["at"]  # the REST API's JSON time, to the letter
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", shown["at"])


def test_a_direct_write_never_waits_on_a_refused_row(jobbers) -> None:
    dispatcher = DeadLetterDispatcher(DjangoDeadLetterSink(), jobbers.store)
    batch = [_poison("nan"), _refused("refused-batch"), dead_letter(), _poison("long-name")]
    assert dispatcher.send_many(batch) == [True, False, True, True]
    assert DeadLetterEntry.objects.count() == 3
    assert [i.task_id for i in jobbers.set_aside().entries] == ["refused-batch"]
    assert jobbers.store.client.llen(jobbers.store.keys.dead_letter_outbox) == 0
