"""A publish that raises leaves no ``submitted`` record waiting for a message that never left.

``before_task_publish`` (where the record is made) runs before kombu encodes the message and
before the broker takes it. When ``apply_async`` raises (an argument kombu cannot encode, a
broker it cannot reach), the caller gets the exception as from plain Celery, and the record
the publish made ends ``dropped`` at once, with the reason and no dead letter.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu.exceptions import EncodeError, OperationalError

from jobbers_celery import JobbersTask, TaskState, get_jobbers, install
from tests.conftest import free_port
from tests.integration.lifecycle_helpers import dead_letters, path

pytestmark = [pytest.mark.redis]

S = TaskState


def _apps(broker: str, store: str) -> tuple[Celery, Celery, Any, Any]:
    """A plain Celery app and a jobbers one, each with one task ``add`` (same code)."""
    name = uuid.uuid4().hex[:8]
    plain = Celery(f"plain{name}", broker=broker, set_as_current=False)
    tracked = Celery(f"jobbers{name}", broker=broker, set_as_current=False)
    for app in (plain, tracked):
        app.conf.update(task_serializer="json", accept_content=["json"],
                        broker_connection_retry_on_startup=True, jobbers_redis_url=store,
                        broker_connection_timeout=1)
    install(tracked)

    def add(x: Any, y: Any) -> Any:
        return x + y

    plain_add = plain.task(name=f"plain{name}.add", shared=False)(add)
    tracked_add = tracked.task(base=JobbersTask, name=f"jobbers{name}.add", shared=False,
                               dead_letter_policy="save")(add)
    return plain, tracked, plain_add, tracked_add


@pytest.fixture
def apps(redis_url: str) -> Iterator[tuple[Celery, Celery, Any, Any]]:
    made = _apps(redis_url, redis_url)
    yield made
    for app in made[:2]:
        app.close()


class Unencodable:
    """Not JSON: kombu's json serializer refuses it."""


def test_unencodable_argument_raises_as_in_celery_and_ends_the_record(apps):
    _plain, tracked, plain_add, tracked_add = apps
    jobbers = get_jobbers(tracked)
    with pytest.raises(EncodeError) as plain_raised:
        plain_add.apply_async((Unencodable(), 1), task_id="p-" + uuid.uuid4().hex)
    task_id = "j-" + uuid.uuid4().hex
    with pytest.raises(EncodeError) as tracked_raised:
        tracked_add.apply_async((Unencodable(), 1), task_id=task_id)
    assert type(tracked_raised.value) is type(plain_raised.value)
    assert str(tracked_raised.value) == str(plain_raised.value)

    record = jobbers.get(task_id)
    assert record is not None
    assert record.state is S.DROPPED
    assert record.attempt == 0  # it never started
    assert record.error is not None
    assert "EncodeError" in record.error.type
    assert path(jobbers, task_id) == [("unsubmitted", "submitted"), ("submitted", "dropped")]
    [ended] = [t for t in jobbers.history(task_id) if t.to_state is S.DROPPED]
    assert ended.reason.startswith("never sent: publishing raised EncodeError: ")
    assert "not JSON serializable" in ended.reason
    # the caller got the exception: no dead letter, even with dead_letter_policy=save
    assert dead_letters(jobbers, task_id) == []
    # dropped is terminal: pruned after jobbers_retention like any other record
    assert task_id not in {r.task_id for r in jobbers.tasks(state=S.SUBMITTED)}


def test_a_later_publish_of_the_same_task_is_recorded_as_usual(apps):
    _, tracked, _, tracked_add = apps
    jobbers = get_jobbers(tracked)
    with pytest.raises(EncodeError):
        tracked_add.apply_async((Unencodable(), 1))
    result = tracked_add.apply_async((1, 2))
    assert jobbers.get(result.id).state is S.SUBMITTED


def test_unreachable_broker_raises_as_in_celery_and_ends_the_record(redis_url):
    closed = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    plain, tracked, plain_add, tracked_add = _apps(closed, redis_url)
    try:
        jobbers = get_jobbers(tracked)
        with pytest.raises(OperationalError):
            plain_add.apply_async((1, 2), retry=False)
        task_id = "j-" + uuid.uuid4().hex
        with pytest.raises(OperationalError):
            tracked_add.apply_async((1, 2), task_id=task_id, retry=False)
        record = jobbers.get(task_id)
        assert record is not None
        assert record.state is S.DROPPED
        [ended] = [t for t in jobbers.history(task_id) if t.to_state is S.DROPPED]
        assert ended.reason.startswith("never sent: publishing raised OperationalError")
        assert dead_letters(jobbers, task_id) == []
    finally:
        plain.close()
        tracked.close()
