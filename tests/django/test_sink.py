"""The Django dead-letter sink: rows, idempotence (also under concurrent writers), groups."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection

from jobbers_django.models import DeadLetterEntry, DeadLetterFailure, FailureGroup, Status
from jobbers_django.sink import DjangoDeadLetterSink, write_entry
from tests.django.conftest import dead_letter

pytestmark = pytest.mark.django_db


def test_entry_and_history_rows():
    first = dead_letter(attempt=1)
    assert write_entry(first)
    second = dead_letter(first.task_id, attempt=2, retry_attempt=1, reason="stalled",
                         exception_type=None, exception_message="no heartbeat for 61s",
                         traceback=None, failed_at=first.failed_at + timedelta(minutes=5))
    assert write_entry(second)
    row = DeadLetterEntry.objects.get(task_id=first.task_id)
    assert row.failure_count == 2
    assert row.first_failed_at == first.failed_at
    assert row.last_failed_at == second.failed_at
    assert (row.reason, row.attempt, row.retry_attempt) == ("stalled", 2, 1)
    assert row.kwargs == {"password": "hunter2", "region": "eu"}  # stored whole
    assert row.checkpoint == {"row": 17}
    assert row.status == Status.DEAD
    assert [f.attempt for f in row.failures.all()] == [1, 2]


def test_same_attempt_twice_is_one_failure():
    entry = dead_letter()
    assert write_entry(entry)
    assert not write_entry(entry)
    DjangoDeadLetterSink().write_many([entry, entry])
    row = DeadLetterEntry.objects.get(task_id=entry.task_id)
    assert row.failure_count == 1
    assert DeadLetterFailure.objects.filter(task_id=entry.task_id).count() == 1
    assert FailureGroup.objects.get(fingerprint=row.fingerprint).failures == 1


def test_older_attempt_arriving_late_keeps_the_newest_fields():
    new = dead_letter(attempt=3)
    old = dead_letter(new.task_id, attempt=2, failed_at=new.failed_at - timedelta(hours=1),
                      worker="old@host")
    write_entry(new)
    write_entry(old)
    row = DeadLetterEntry.objects.get(task_id=new.task_id)
    assert (row.attempt, row.worker, row.failure_count) == (3, "w1@host", 2)
    assert row.first_failed_at == old.failed_at


def test_hundreds_of_failures_of_one_bug_are_one_group():
    """300 failures whose messages differ by row, catalog and request id (1,000 took 71 s of
    the suite under load; 300 vary the same parts)."""
    for n in range(300):
        write_entry(dead_letter(exception_message=f"upstream rejected row {n} of "
                                f"catalog-{n * 7} (request 5f0c{n:04x}-aaaa-bbbb-cccc-"
                                "0123456789ab)"))
    write_entry(dead_letter(exception_type="builtins.KeyError", exception_message="'sku'"))
    groups = list(FailureGroup.objects.order_by("-failures"))
    assert [(g.failures, g.dead) for g in groups] == [(300, 300), (1, 1)]
    assert groups[0].frame == "shop/imports.py:flaky_import" or groups[0].frame.endswith(
        "imports.py:flaky_import")
    assert groups[0].first_seen < groups[0].last_seen
    assert DjangoDeadLetterSink().size() == 301


@pytest.mark.django_db(transaction=True)
def test_concurrent_writes_of_the_same_attempt_store_one():
    """16 threads (own connections) write the same 20 (task id, attempt) pairs at once."""
    entries = [dead_letter(attempt=a) for a in (1, 2) for _ in range(10)]
    barrier = threading.Barrier(16)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            barrier.wait()
            for entry in entries:
                write_entry(entry)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert DeadLetterFailure.objects.count() == 20
    assert DeadLetterEntry.objects.count() == 20
    assert sorted(DeadLetterEntry.objects.values_list("failure_count", flat=True)) == [1] * 20
    assert sum(FailureGroup.objects.values_list("failures", flat=True)) == 20
    assert sum(FailureGroup.objects.values_list("dead", flat=True)) == 20


def test_entry_hands_back_the_last_failure_of_that_attempt():
    first = dead_letter(attempt=1, args=["catalog-42", "x" * 100_000])
    write_entry(first)
    sink = DjangoDeadLetterSink()
    got = sink.entry(first.task_id, 1)
    assert got is not None
    assert (got.args, got.kwargs, got.options, got.checkpoint, got.version) == (
        first.args, first.kwargs, first.options, first.checkpoint, first.version)
    assert sink.entry(first.task_id, 2) is None  # not that attempt's entry
    assert sink.entry("no-such-task", 1) is None


def test_a_written_entry_drops_the_records_copy_and_resubmit_takes_it_back(jobbers, published):
    """The record of a dead-lettered task keeps no payload once the database has it;
    ``jobbers.resubmit`` publishes the task with the entry's arguments."""
    from jobbers_celery import TaskState
    from jobbers_celery.lifecycle import payload as pl

    S = TaskState
    store = jobbers.store
    entry = dead_letter(attempt=1, args=["catalog-42", "x" * 100_000])
    msg = pl.dumps({"args": entry.args, "kwargs": entry.kwargs, "options": entry.options})
    store.step(entry.task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,),
               create={"name": entry.name, "queue": "celery", "dlq": "1"},
               set_fields={"msg": msg}, name=entry.name)
    store.step(entry.task_id, S.STARTED, start=True)
    assert store.step(entry.task_id, S.FAILED).attempt == 1

    assert jobbers.dead_letters.send(entry)
    key = store.keys_of(entry.task_id).task(entry.task_id)
    assert not store.client.hexists(key, "msg")
    assert store.client.memory_usage(key, samples=0) <= 1024

    assert jobbers.resubmit([entry.task_id]) == [entry.task_id]
    assert published == [entry.task_id]
    assert pl.loads(store.client.hget(key, "msg"))["args"] == entry.args  # back for the lease
    assert jobbers.history(entry.task_id)[-1].reason == "resubmitted (retry count reset)"
