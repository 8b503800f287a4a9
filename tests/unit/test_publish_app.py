"""Which installed app records the publish of a task name no app knows (``send_task``)."""

from __future__ import annotations

from celery import Celery
from celery._state import get_current_app

from jobbers_celery import install, signals


def test_a_name_no_app_knows_is_recorded_by_the_current_app():
    previous = get_current_app()
    first = Celery("first", broker="redis://127.0.0.1:1/0", set_as_current=False)
    second = Celery("second", broker="redis://127.0.0.1:1/1", set_as_current=False)
    install(first), install(second)
    try:
        second.set_current()
        jobbers, task = signals._for_publish("nowhere.registered")
        assert (jobbers.app if jobbers else None, task) == (second, None)
        first.set_current()
        assert signals._for_publish("nowhere.registered")[0].app is first
    finally:
        previous.set_current()
