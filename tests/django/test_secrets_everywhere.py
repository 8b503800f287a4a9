"""Secrets planted in a task's arguments and in the exceptions it raises are found nowhere
people read: the worker's log (debug level), the raw task events a worker started with ``-E``
sends (what Flower shows), Celery's result backend, the jobbers record, the dead-letter rows,
the admin pages and the API answers. The task itself, its delayed retry (republished by the
scheduler) and its resubmission get the real values (it writes them down)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from jobbers_celery import TaskState
from jobbers_django.models import DeadLetterEntry
from tests.conftest import wait_for
from tests.rabbitmq import RabbitVhost, use_broker

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SECRET = "pos-s3cret-9"  # positional, matched by its parameter name (``secret``)
PASSWORD = "pw-hunter2-7"  # a kwarg named password
DSN = "postgres://u:url-pass-5@db.example/app"  # a URL with a password
AUTH = "Bearer tok-abc.123"  # a bearer token under an innocent key
PLANTED = (SECRET, PASSWORD, "url-pass-5", "tok-abc.123", "exc-0nly-tok")


@pytest.fixture(params=["prefork", "threads"])
def dj_worker_args(request: pytest.FixtureRequest) -> list[str]:
    # task events on; the log at its most talkative; the pool (the last -P wins)
    return ["-E", "-l", "DEBUG", "-P", request.param]


@pytest.fixture
def events(djapp: Any) -> Iterator[list[dict[str, Any]]]:
    """Every event on the broker while the test runs (an ``app.events.Receiver``)."""
    app = djapp.app
    got: list[dict[str, Any]] = []
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def on_event(event: dict[str, Any]) -> None:
        got.append(event)

    def run() -> None:
        with app.connection_for_read() as conn:
            recv = app.events.Receiver(conn, handlers={"*": on_event})
            holder["recv"] = recv
            ready.set()
            recv.capture(limit=None, timeout=None, wakeup=False)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    # the receiver is bound once an event of our own comes back
    probe = f"probe-{uuid.uuid4().hex[:8]}"
    with app.events.default_dispatcher() as dispatcher:
        def probed() -> bool:
            dispatcher.send("jobbers-test-probe", probe=probe)
            return any(e.get("probe") == probe for e in got)
        wait_for(probed, timeout=15, interval=0.2, message="the event receiver to listen")
    yield got
    holder["recv"].should_stop = True
    thread.join(5)


def _found(text: str) -> list[str]:
    return [s for s in PLANTED if s in text]


def test_planted_secrets_are_found_in_none_of_the_places_people_read(
        djapp, jobbers, dj_worker, events, operator, client, tmp_path: Path):
    plant_and_search(djapp, jobbers, events, client, operator, tmp_path)


@pytest.fixture
def on_rabbitmq(djapp: Any, rabbitmq: RabbitVhost,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process and the worker on the session's RabbitMQ vhost (state in Redis)."""
    rabbitmq.reset()
    with use_broker(djapp.app, rabbitmq.url, monkeypatch):
        yield
    rabbitmq.reset()


@pytest.mark.rabbitmq
@pytest.mark.parametrize("dj_worker_args", [["-E", "-l", "DEBUG", "-P", "prefork"]])
def test_on_rabbitmq_too(on_rabbitmq, djapp, jobbers, dj_worker, events, operator, client,
                         tmp_path: Path):
    plant_and_search(djapp, jobbers, events, client, operator, tmp_path)
    assert "transport:   amqp://" in (tmp_path / "worker.log").read_text()


def plant_and_search(djapp: Any, jobbers: Any, events: list[dict[str, Any]], client: Any,
                     operator: Any, tmp_path: Path) -> None:
    key = f"djproj:leak:{uuid.uuid4().hex[:8]}"
    conf = djapp.app.conf
    sent_event = conf.task_send_sent_event
    conf.task_send_sent_event = True  # the client's task-sent event, built before the publish
    try:
        result = djapp.leaky_login.apply_async((key, SECRET),
                                               {"password": PASSWORD, "dsn": DSN, "auth": AUTH})
    finally:
        conf.task_send_sent_event = sent_event
    entry = wait_for(lambda: DeadLetterEntry.objects.filter(task_id=result.id).first(),
                     timeout=30, message="the dead-letter entry in PostgreSQL")
    wait_for(lambda: any(e["type"] == "task-failed" and e.get("uuid") == result.id
                         for e in events), timeout=20, message="the task-failed event")

    # what Celery's result backend says of the failure (the resubmission replaces it)
    backend_failure = repr(djapp.app.backend.get_task_meta(result.id))
    assert "PermissionError" in backend_failure

    # the task got the real values; the stored payload keeps them for resubmission
    got = [json.loads(v) for v in jobbers.store.client.lrange(f"{key}:got", 0, -1)]
    assert got == [[SECRET, PASSWORD, DSN, AUTH]] * 2  # the first run and its retry
    assert (entry.args, entry.kwargs) == ([key, SECRET],
                                          {"password": PASSWORD, "dsn": DSN, "auth": AUTH})

    # resubmit: it runs again with the real values and completes
    jobbers.store.client.set(key, "fixed")
    client.force_login(operator)
    answers: dict[str, str] = {}
    response = client.post("/jobbers/dead-letter-queue/resubmit", {"task_ids": [result.id]},
                           content_type="application/json")
    assert response.status_code == 200, response.content
    answers["API resubmit answer"] = response.content.decode()
    wait_for(lambda: (r := jobbers.get(result.id)) and r.state == TaskState.COMPLETED,
             timeout=30, message="the resubmitted task to complete")
    got = [json.loads(v) for v in jobbers.store.client.lrange(f"{key}:got", 0, -1)]
    assert got == [[SECRET, PASSWORD, DSN, AUTH]] * 3
    wait_for(lambda: sum(e["type"] == "task-received" and e.get("uuid") == result.id
                         for e in events) == 3 and any(
        e["type"] == "task-succeeded" and e.get("uuid") == result.id for e in events),
        timeout=20, message="the resubmission's events")

    # the places people read
    places: dict[str, str] = {}
    places["worker log"] = (tmp_path / "worker.log").read_text()
    places["result backend (the failure)"] = backend_failure
    assert f"{result.id}] received" in places["worker log"]  # the log is the worker's
    for event in events:
        if event.get("uuid") == result.id:
            place = f"event {event['type']}"
            places[place] = places.get(place, "") + json.dumps(event, default=str)
    assert {"event task-sent", "event task-received", "event task-retried",
            "event task-failed"} <= set(places)
    record = jobbers.get(result.id)
    places["jobbers record and history"] = repr(record) + repr(jobbers.history(result.id))
    entry.refresh_from_db()
    places["dead-letter rows"] = repr([
        (f.exception_message, f.traceback) for f in entry.failures.all()]) + repr(
        (entry.exception_message, entry.traceback))
    pages = {
        "admin DLQ list": reverse("admin:jobbers_deadletterentry_changelist"),
        "admin DLQ entry": reverse("admin:jobbers_deadletterentry_change", args=[entry.pk]),
        "admin failure groups": reverse("admin:jobbers_failuregroup_changelist"),
        "admin live task": reverse("admin:jobbers_task", args=[result.id]),
        "API DLQ list": "/jobbers/dead-letter-queue",
        "API DLQ history": f"/jobbers/dead-letter-queue/{result.id}/history",
        "API task detail": f"/jobbers/tasks/{result.id}",
    }
    for place, url in pages.items():
        response = client.get(url)
        assert response.status_code == 200, (place, response.status_code)
        places[place] = response.content.decode()
    places.update(answers)

    leaks = {place: found for place, text in places.items() if (found := _found(text))}
    print(f"secrets found: {sum(map(len, leaks.values()))} of {len(places)} places searched "
          f"({len(PLANTED)} secrets each): {sorted(places)}")
    assert leaks == {}
    # the first publish, the scheduler's retry and the resubmission: reprs shown, redacted
    received = places["event task-received"]
    assert received.count("'password': '********'") == 3
    assert received.count(f"'{key}', '********'") == 3  # the positional secret
    # ``auth`` and ``dsn`` are secret keys (whole words of a key): hidden whole
    assert received.count("'auth': '********'") == 3
    assert received.count("'dsn': '********'") == 3
    assert "'password': '********'" in places["event task-sent"]
    assert "********" in places["admin DLQ entry"]
    assert "PermissionError" in places["API DLQ history"]  # the failure is there, redacted
