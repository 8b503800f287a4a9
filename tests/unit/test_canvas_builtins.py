"""The tracked ``celery.starmap``, ``celery.map`` and ``celery.chord_unlock``
(``jobbers_celery.worker.canvas``): on the installed app only, whenever it is finalized, and
with Celery's results (eager here; the worker cases are in
tests/integration/test_starmap_chunks.py and test_chords.py)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, Task

from jobbers_celery import JobbersTask
from jobbers_celery.testing import InMemoryDeadLetterSink, InMemoryStore, in_memory
from jobbers_celery.worker.canvas import TrackedMap, TrackedUnlock

BUILTINS = ("celery.starmap", "celery.map")


def _app(name: str) -> Celery:
    app = Celery(name, broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.task_always_eager = True
    return app


def _add(app: Celery, base: type[Task[Any, Any]]) -> Any:
    @app.task(base=base, name=f"{app.main}.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    return add


@pytest.mark.parametrize("finalized_first", [False, True])
def test_installed_app_runs_tracked_builtins(finalized_first: bool) -> None:
    app = _app(f"canvas_tracked_{finalized_first}")
    if finalized_first:
        app.finalize()
    in_memory(app, InMemoryStore(), InMemoryDeadLetterSink())
    for name in BUILTINS:
        task = app.tasks[name]
        assert isinstance(task, TrackedMap)
        assert task.name == name
        assert task.app is app
        assert task.jobbers_options.dead_letter_policy.value == "save"
    unlock = app.tasks["celery.chord_unlock"]
    assert isinstance(unlock, TrackedUnlock)
    assert not isinstance(unlock, JobbersTask)  # a poll a second: not a lifecycle
    # Celery's options of the poll
    assert (unlock.max_retries, unlock.ignore_result, unlock.default_retry_delay) == (
        None, True, app.conf.result_chord_retry_interval)
    in_memory(app, InMemoryStore(), InMemoryDeadLetterSink())  # again: nothing changes
    assert isinstance(app.tasks["celery.starmap"], TrackedMap)
    assert app.tasks["celery.chord_unlock"] is unlock


def test_an_app_without_jobbers_keeps_celerys_builtins() -> None:
    installed = _app("canvas_installed")
    in_memory(installed, InMemoryStore(), InMemoryDeadLetterSink())
    plain = _app("canvas_plain")  # in the same process, after another app was installed
    for name in (*BUILTINS, "celery.chord_unlock"):
        assert not isinstance(plain.tasks[name], TrackedMap | TrackedUnlock)
        assert type(plain.tasks[name]).__module__ == "celery.app.builtins"


def test_eager_results_are_celerys() -> None:
    seen = {}
    for kind in ("plain", "jobbers"):
        app = _app(f"canvas_eager_{kind}")
        base: type[Task[Any, Any]] = Task
        if kind == "jobbers":
            in_memory(app, InMemoryStore(), InMemoryDeadLetterSink())
            base = JobbersTask
        add = _add(app, base)
        items = [(i, i) for i in range(5)]
        seen[kind] = (add.starmap(items).apply_async().get(),
                      add.chunks(items, 2).apply_async().get(),
                      add.starmap(items)())
    assert seen["jobbers"] == seen["plain"]
    assert seen["plain"][0] == [0, 2, 4, 6, 8]
