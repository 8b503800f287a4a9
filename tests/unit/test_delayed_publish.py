"""``apply_async`` with ``countdown``/``eta`` on a JobbersTask when the store cannot take it:
Celery's ETA message, with a warning (the Redis path: tests/integration/test_delayed_publish.py)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from celery import Celery, Task
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobbers_celery import JobbersTask, install
from jobbers_celery.worker.delays import seconds_until as _seconds_until
from tests.conftest import free_port


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What reaches Celery's own ``apply_async`` (nothing is published)."""
    calls: list[dict[str, Any]] = []

    def apply_async(self: Task, *args: Any, **options: Any) -> str:  # type: ignore[type-arg]
        calls.append(options)
        return "celery"

    monkeypatch.setattr(Task, "apply_async", apply_async)
    return calls


@pytest.fixture
def later() -> JobbersTask:
    app = Celery("later", broker=f"redis://127.0.0.1:{free_port()}/0", set_as_current=False)
    jobbers = install(app)
    jobbers.store.client = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))

    @app.task(base=JobbersTask, name="later.echo", shared=False)
    def echo(x: Any) -> Any:
        return x

    return echo  # type: ignore[return-value]


def test_a_store_it_cannot_reach_sends_an_eta_message(later, sent, caplog):
    with caplog.at_level(logging.WARNING, logger="jobbers.task"):
        assert later.apply_async((1,), countdown=5) == "celery"
    assert sent[0]["countdown"] == 5
    assert "the state store cannot be reached: sent as an ETA message" in caplog.text


def test_arguments_that_are_not_json_send_an_eta_message(later, sent, caplog):
    with caplog.at_level(logging.WARNING, logger="jobbers.task"):
        assert later.apply_async((object(),), countdown=5) == "celery"
    assert "not JSON" in caplog.text


def test_without_a_delay_celery_publishes_as_usual(later, sent):
    past = datetime.now(UTC) - timedelta(seconds=1)
    for options in ({}, {"countdown": 0}, {"eta": past}, {"eta": past.isoformat()}):
        assert later.apply_async((1,), **options) == "celery"
    assert len(sent) == 4


def test_the_delay_of_a_countdown_or_an_eta():
    assert _seconds_until(None, None) == 0.0
    assert _seconds_until(2.5, datetime.now(UTC) + timedelta(hours=1)) == 2.5  # as Celery
    soon = datetime.now(UTC) + timedelta(seconds=60)
    assert 59 < _seconds_until(None, soon) <= 60
    assert 59 < _seconds_until(None, soon.replace(tzinfo=None)) <= 60  # naive: UTC
    assert 59 < _seconds_until(None, soon.isoformat()) <= 60
