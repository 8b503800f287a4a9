"""A worker process and a state-store outage (docs/howto/redis-settings.md, "An outage or a
restart"): the outcome of a finished task is held and sent again until the store answers,
with a growing, bounded pause; the outage is logged once when it begins and once when it
ends, not once per task. End to end in tests/integration/test_store_outage.py."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest
import redis

from jobbers_celery import task as task_module
from jobbers_celery.task import (
    OUTAGE_RESEND_FIRST_PAUSE_S,
    OUTAGE_RESEND_MAX_PAUSE_S,
    JobbersTask,
)


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(task_module.time, "sleep", slept.append)
    monkeypatch.setattr(task_module, "_outage", task_module._Outage())
    return slept


def test_a_finished_tasks_outcome_is_sent_again_until_the_store_answers(
        pauses: list[float], caplog: pytest.LogCaptureFixture) -> None:
    tries = []

    def step() -> str:
        tries.append(1)
        if len(tries) <= 8:
            raise redis.ConnectionError("Connection refused")
        return "recorded"

    self: Any = None  # the method uses nothing of the task
    with caplog.at_level(logging.WARNING, logger="jobbers.task"):
        assert JobbersTask._resend_after_outage(self, step) == "recorded"
    assert len(tries) == 9
    assert pauses[0] == OUTAGE_RESEND_FIRST_PAUSE_S
    assert all(b == min(2 * a, OUTAGE_RESEND_MAX_PAUSE_S) for a, b in itertools.pairwise(pauses))
    assert max(pauses) == OUTAGE_RESEND_MAX_PAUSE_S
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("the jobbers state store cannot be reached")
    assert lines[1].startswith("the jobbers state store answers again")


def test_the_outage_is_logged_once_however_many_tasks_meet_it(
        pauses: list[float], caplog: pytest.LogCaptureFixture) -> None:
    outage = task_module._outage
    with caplog.at_level(logging.WARNING, logger="jobbers.task"):
        for _ in range(50):
            outage.began()
        outage.over()
        outage.over()  # a task that starts once it is over: nothing more to say
        outage.began()  # the next outage is logged again
    lines = [r.getMessage()[:40] for r in caplog.records]
    assert lines == ["the jobbers state store cannot be reache",
                     "the jobbers state store answers again (u",
                     "the jobbers state store cannot be reache"]
