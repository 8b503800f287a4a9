"""Which installed app records the publish of a task name no app knows (``send_task``)."""

from __future__ import annotations

from celery import Celery
from celery._state import get_current_app

from jobbers_celery import install
from jobbers_celery.worker import signals


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


def test_a_name_two_apps_register_is_recorded_by_the_app_that_publishes_it(monkeypatch):
    """A test suite or a process with two apps: each publish lands in its own app's store,
    not in that of the oldest app that registers the name."""
    from jobbers_celery import JobbersTask
    from jobbers_celery.lifecycle import publisher

    seen = []

    def send_task(app, name, *args, **kwargs):  # what before_task_publish would see
        seen.append(signals._for_publish(name))

    monkeypatch.setattr(Celery, "send_task", send_task)  # install wraps what it finds
    apps = [Celery(f"app{i}", broker=f"redis://127.0.0.1:1/{i}", set_as_current=False)
            for i in range(2)]
    tasks = []
    for app in apps:
        install(app)

        def body() -> None:
            """Never runs."""

        tasks.append(app.task(base=JobbersTask, name="shared.name", shared=False)(body))
    assert signals._for_publish("shared.name")[0].app is apps[0]  # no sender known

    tasks[1].apply_async()
    tasks[0].delay()
    apps[1].send_task("shared.name")
    apps[1].send_task("nowhere.registered")
    assert [(j.app if j else None, t) for j, t in seen] == [
        (apps[1], tasks[1]), (apps[0], tasks[0]), (apps[1], tasks[1]), (apps[1], None)]
    token = publisher.mark_publishing(apps[1])
    assert signals._for_publish("shared.name")[0].app is apps[1]
    publisher.unmark_publishing(token)
    assert publisher.publishing_app() is None
