"""A unique task's chord member published while the store was away, recorded late by the
worker at its start while another copy holds its key (worker/start.py
``_record_late_submit``; found by review): it does not run, and its chord counts its part
as REVOKED, so the chord's callback fails with ``ChordError`` instead of waiting for ever,
as for a duplicate member refused at publish. In memory, an embedded worker."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery, chord
from celery.exceptions import ChordError, TaskRevokedError

from jobbers_celery import Jobbers, JobbersTask, TaskState
from jobbers_celery.core.unique import Unique
from jobbers_celery.testing import (
    InMemoryDeadLetterSink,
    InMemoryStore,
    embedded_worker,
    in_memory,
)
from tests.conftest import wait_for

S = TaskState
app = Celery("unique_late_canvas", broker="memory://", backend="cache+memory://")
app.conf.broker_transport_options = {"polling_interval": 0.01}


class AwayStore(InMemoryStore):
    """The in-memory store, unreachable for publishes while ``away``."""

    away = False

    def submit(self, task_id: str, **kw: Any) -> Any:
        if self.away:
            raise redis.ConnectionError("the store is away")
        return super().submit(task_id, **kw)

    def submit_many(self, items: Any) -> Any:
        if self.away:
            raise redis.ConnectionError("the store is away")
        return super().submit_many(items)


@app.task(base=JobbersTask, name="ulc.one", shared=False, unique=Unique(on=(0,)))
def one(key: str) -> str:
    return key


@app.task(base=JobbersTask, name="ulc.plain", shared=False)
def plain(x: int) -> int:
    return x


@app.task(base=JobbersTask, name="ulc.total", shared=False)
def total(values: list[Any]) -> int:
    return len(values)


@pytest.fixture
def setup() -> tuple[Jobbers, AwayStore]:
    store = AwayStore()
    return in_memory(app, store, InMemoryDeadLetterSink()), store


def test_a_late_duplicate_chord_member_counts_its_part_revoked(
        setup: tuple[Jobbers, AwayStore]) -> None:
    jobbers, store = setup
    holder = one.apply_async(("k",), queue="nobody")  # holds "k", never consumed here
    assert jobbers.get(holder.id) is not None
    store.away = True
    result = chord([one.s("k"), plain.s(1)], total.s()).apply_async()
    member = result.parent.results[0].id
    assert jobbers.get(member) is None  # went out unrecorded
    store.away = False
    with embedded_worker(app, pool="threads", concurrency=2, shutdown_timeout=30):
        # Celery raises the chord's error, or the revoked member's when get() looks at the
        # header first: either way it does not wait for ever
        with pytest.raises((ChordError, TaskRevokedError)):
            result.get(timeout=20)
        wait_for(lambda: app.AsyncResult(result.id).state == "FAILURE", timeout=10,
                 message="the chord's callback failed (the member's part counted)")
        assert app.AsyncResult(member).state == "REVOKED"
        wait_for(lambda: app.AsyncResult(result.parent.results[1].id).state == "SUCCESS",
                 timeout=10, message="the other member")
    assert jobbers.get(member) is None  # not run, no record
