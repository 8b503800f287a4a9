"""The shared resubmit/discard service: at most once per entry under races, publish only
after commit, nothing published on rollback, recovery of a publish that never ran."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from jobbers_celery import TaskState
from jobbers_django import services
from jobbers_django.models import (
    DeadLetterAudit,
    DeadLetterEntry,
    FailureGroup,
    Source,
    Status,
)
from jobbers_django.services import Selection, SelectionError

S = TaskState



def test_resubmit_by_ids_publishes_after_commit(committed, make_entries, jobbers, published):
    ids = make_entries(3)
    result = committed(services.resubmit, Selection(task_ids=tuple(ids)), source=Source.API)
    assert sorted(result.acted) == sorted(ids)
    assert sorted(result.published or []) == sorted(ids)
    assert sorted(published) == sorted(ids)
    for task_id in ids:
        record = jobbers.get(task_id)
        assert record.state == S.SUBMITTED
        assert record.checkpoint == {"row": 17}
        assert jobbers.history(task_id)[-1].reason == (
            "resubmitted (retry count reset) from the dead-letter queue")
    rows = DeadLetterEntry.objects.filter(task_id__in=ids)
    assert {(r.status, r.resubmit_count, r.publish_pending) for r in rows} == {
        (Status.RESUBMITTED, 1, False)}
    assert sum(FailureGroup.objects.values_list("dead", flat=True)) == 0
    audit = DeadLetterAudit.objects.get()
    assert (audit.action, audit.source, audit.matched, audit.acted) == ("resubmit", "api", 3, 3)
    # A second request finds nothing dead: nothing is published again.
    again = committed(services.resubmit, Selection(task_ids=tuple(ids)))
    assert again.acted == []
    assert len(published) == 3
    assert {s["why"] for s in again.skipped} == {"status is resubmitted"}


def test_a_failed_record_goes_failed_to_submitted(committed, make_entries, jobbers, published):
    """With the task's Redis record still there, its lifecycle shows failed -> submitted."""
    (task_id,) = make_entries(1)
    store = jobbers.store
    store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,),
               create={"name": "djproj.flaky_import", "queue": "celery"})
    store.step(task_id, S.STARTED, start=True)
    store.step(task_id, S.FAILED)
    committed(services.resubmit, Selection(task_ids=(task_id,)), reset_retry_count=False)
    last = jobbers.history(task_id)[-1]
    assert (last.from_state, last.to_state) == (S.FAILED, S.SUBMITTED)
    assert published == [task_id]


def test_nothing_is_published_when_the_transaction_rolls_back(make_entries, published):
    ids = make_entries(2)
    seen: list[services.ActionResult] = []

    def request_that_fails() -> None:
        with transaction.atomic():
            seen.append(services.resubmit(Selection(task_ids=tuple(ids))))
            raise RuntimeError("the request failed after the service ran")

    with pytest.raises(RuntimeError):
        request_that_fails()
    assert seen[0].published is None  # it waited for the outer commit, which never came
    assert published == []
    assert set(DeadLetterEntry.objects.values_list("status", flat=True)) == {Status.DEAD}
    assert not DeadLetterAudit.objects.exists()


def test_filters_limit_and_dry_run(committed, make_entries, published):
    make_entries(5, name="djproj.export")
    make_entries(2)
    preview = services.resubmit(Selection(filters={"task_name": "djproj.export"}, limit=3),
                                dry_run=True)
    assert (preview.matched, preview.more, preview.acted) == (3, True, [])
    assert len(preview.sample) == 3
    assert not DeadLetterAudit.objects.exists()
    assert published == []
    done = committed(services.resubmit, Selection(filters={"task_name": "djproj.export"},
                                                      limit=3))
    assert len(done.acted) == 3
    assert done.more
    assert DeadLetterEntry.objects.filter(status=Status.DEAD).count() == 4


def test_discard(make_entries, published):
    ids = make_entries(2)
    result = services.discard(Selection(task_ids=tuple(ids)))
    assert sorted(result.acted) == sorted(ids)
    assert published == []
    assert set(DeadLetterEntry.objects.values_list("status", flat=True)) == {Status.DISCARDED}
    assert sum(FailureGroup.objects.values_list("dead", flat=True)) == 0


@pytest.mark.parametrize(("kwargs", "field"), [
    ({}, "filters"),
    ({"task_ids": ()}, "task_ids"),
    ({"task_ids": tuple(str(i) for i in range(1001))}, "task_ids"),
    ({"task_ids": ("a",), "filters": {"queue": "q"}}, "task_ids"),
    ({"filters": {"nope": 1}}, "nope"),
    ({"filters": {"queue": "q"}, "limit": 0}, "limit"),
    ({"filters": {"queue": "q"}, "limit": 10**9}, "limit"),
])
def test_bad_selections_name_the_field(kwargs, field):
    with pytest.raises(SelectionError) as info:
        Selection(**kwargs)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_a_publish_that_never_ran_is_recovered(make_entries, jobbers, published):
    """The process died between the commit and the publish: publish_pending does it."""
    (task_id,) = make_entries(1)
    DeadLetterEntry.objects.filter(task_id=task_id).update(
        status=Status.RESUBMITTED, publish_pending=True,
        resubmitted_at=timezone.now() - timedelta(minutes=5))
    assert services.publish_pending() == 1
    assert published == [task_id]
    assert jobbers.get(task_id).state == S.SUBMITTED
    assert not DeadLetterEntry.objects.get(task_id=task_id).publish_pending
    assert services.publish_pending() == 0


def test_a_new_failure_after_a_resubmit_makes_the_entry_dead_again(committed, make_entries, published):
    from jobbers_django.sink import write_entry
    from tests.django.conftest import dead_letter

    (task_id,) = make_entries(1)
    committed(services.resubmit, Selection(task_ids=(task_id,)))
    write_entry(dead_letter(task_id, attempt=2))
    row = DeadLetterEntry.objects.get(task_id=task_id)
    assert (row.status, row.failure_count, row.resubmit_count) == (Status.DEAD, 2, 1)
    assert FailureGroup.objects.get(fingerprint=row.fingerprint).dead == 1


@pytest.mark.django_db(transaction=True)
def test_racing_resubmits_of_the_same_100_entries_publish_100(make_entries, jobbers,
                                                                published):
    ids = tuple(make_entries(100))
    barrier = threading.Barrier(6)
    results: list[services.ActionResult] = []
    errors: list[BaseException] = []

    def request() -> None:
        try:
            barrier.wait()
            results.append(services.resubmit(Selection(task_ids=ids), source=Source.API))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=request) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(published) == sorted(ids)  # exactly 100 publishes
    assert sorted(i for r in results for i in r.acted) == sorted(ids)
    assert set(DeadLetterEntry.objects.values_list("resubmit_count", flat=True)) == {1}
    assert jobbers.store.client.llen("celery") == 100
    assert jobbers.counts()[S.SUBMITTED] == 100


def test_explicit_ids_are_all_taken_whatever_the_default_limit(make_entries, committed):
    ids = tuple(make_entries(150))
    result = committed(services.discard, Selection(task_ids=ids))
    assert len(result.acted) == 150


def test_redis_down_after_commit_leaves_the_entries_pending(make_entries, committed,
                                                            monkeypatch, published):
    from django.core.management import call_command

    ids = tuple(make_entries(2))

    def broken(*_a, **_k):
        raise ConnectionError("redis is down")

    jobbers = services.get_jobbers()
    monkeypatch.setattr(jobbers, "resubmit_dead_letters", broken)
    result = committed(services.resubmit, Selection(task_ids=ids))
    assert sorted(result.acted) == sorted(ids)
    assert result.published == []
    assert DeadLetterEntry.objects.filter(publish_pending=True).count() == 2
    monkeypatch.undo()
    DeadLetterEntry.objects.update(resubmitted_at=timezone.now() - timedelta(minutes=1))
    call_command("jobbers_publish_pending")
    assert sorted(published) == sorted(ids)
    assert not DeadLetterEntry.objects.filter(publish_pending=True).exists()


def test_discard_releases_the_chord_part_a_member_held(committed, make_entries, jobbers,
                                                        djapp):
    """A chord header member dead-lettered holds its chord part (the callback waits for a
    resubmit: jobbers_celery.lifecycle.chords); discarding its entry counts the part failed
    once the discard commits, so the callback fails with Celery's ChordError."""
    from celery import states
    from celery.app.task import Context
    from celery.exceptions import ChordError

    app, backend = djapp.app, djapp.app.backend
    group_id = str(uuid.uuid4())
    callback = app.signature("djproj.flaky_import", args=("callback",))
    callback_id = callback.freeze().id
    backend.set_chord_size(group_id, 2)
    backend.on_chord_part_return(Context(id=str(uuid.uuid4()), group=group_id, group_index=0,
                                         chord=dict(callback)), states.SUCCESS, 1)
    (task_id,) = make_entries(1, options={"queue": "celery", "chord": dict(callback),
                                          "group_id": group_id, "group_index": 1})
    store = jobbers.store
    store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,),
               create={"name": "djproj.flaky_import", "queue": "celery"})
    store.step(task_id, S.STARTED, start=True)
    store.step(task_id, S.FAILED)
    assert app.AsyncResult(callback_id).state == "PENDING"  # held: the callback waits

    committed(services.discard, Selection(task_ids=(task_id,)))
    result = app.AsyncResult(callback_id)
    assert result.state == "FAILURE"
    assert isinstance(result.result, ChordError)
    assert task_id in str(result.result)
