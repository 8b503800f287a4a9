"""The Django dead-letter end to end again, on RabbitMQ (``amqp://`` broker, state in Redis):
a real worker fails a task into PostgreSQL, the REST API resubmits it through the broker,
the task completes. The test is test_end_to_end's (tests/django/end_to_end_helpers.py),
unchanged; only the broker differs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.django.end_to_end_helpers import fail_appear_resubmit_complete
from tests.rabbitmq import RabbitVhost, use_broker

pytestmark = [pytest.mark.worker, pytest.mark.rabbitmq, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def on_rabbitmq(djapp: Any, rabbitmq: RabbitVhost,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test's broker (this process and its worker) is the session's RabbitMQ vhost."""
    rabbitmq.reset()
    with use_broker(djapp.app, rabbitmq.url, monkeypatch):
        yield
    rabbitmq.reset()


def test_fail_appear_resubmit_complete(djapp, jobbers, dj_worker, operator, client,
                                       tmp_path):
    fail_appear_resubmit_complete(djapp, jobbers, operator, client)
    assert "transport:   amqp://" in (tmp_path / "worker.log").read_text()
