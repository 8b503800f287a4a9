"""jobbers_celery.testing: test code that uses JobbersTask without a Redis server.

Why: a user's tests should check what their tasks do with heartbeats, checkpoints,
cancellation, retries and dead letters in milliseconds, on any machine. This module holds
public in-memory fakes of what jobbers keeps in Redis (in the manner of procrastinate's
``InMemoryConnector`` and dramatiq's ``StubBackend``), and :func:`in_memory`, which installs
jobbers on a Celery app with them.

- :class:`InMemoryStore`: the lifecycle steps, heartbeats, cancellation, reads and publish
  leases, and the dead-letter outbox (``parked``: what the sink refused); each step checks
  the one transition table (``core/states.py``), so an illegal transition is refused as
  Redis refuses it.
- :class:`InMemoryDeadLetterSink`: the dead letters, in a list a test reads.
- :func:`in_memory`: ``install(app)``, then a ``Jobbers`` over both (``Jobbers(app,
  config, store=..., sink=...)``); run the tasks on Celery's embedded worker
  (:func:`embedded_worker`, ``celery.contrib.testing.worker.start_worker`` or the
  ``celery_worker`` fixture) with the ``memory://`` broker.
- :func:`embedded_worker`: ``start_worker``, leaving the process as it found it. Not eager mode: an eager call (``task_always_eager``, ``apply()``)
  runs a JobbersTask untracked, as in production, so nothing would be recorded.

See ``docs/howto/testing.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobbers_celery.testing.embedded import embedded_worker
from jobbers_celery.testing.sink import InMemoryDeadLetterSink
from jobbers_celery.testing.store import HeartbeatSent, InMemoryStore

if TYPE_CHECKING:
    from celery import Celery

    from jobbers_celery.jobbers import Jobbers

__all__ = ["HeartbeatSent", "InMemoryDeadLetterSink", "InMemoryStore", "embedded_worker",
           "in_memory"]


def in_memory(app: Celery, store: InMemoryStore | None = None,
              sink: InMemoryDeadLetterSink | None = None) -> Jobbers:
    """Install jobbers on ``app`` (as :func:`jobbers_celery.install`) over an
    :class:`InMemoryStore` and an :class:`InMemoryDeadLetterSink` (``jobbers.store``,
    ``jobbers.sink``), and return its :class:`~jobbers_celery.Jobbers`.

    Call it instead of ``install(app)``, or after it (an app your module installed gets a
    new ``Jobbers`` over the fakes; the Redis client it made is never used), before the
    app's first task is published in the test. The app needs no Redis: give it
    ``broker="memory://"`` and run its tasks on an embedded worker. Called again with new
    fakes, it starts the app over on them (one fresh store per test). A dead letter the
    sink refuses waits in the store's outbox (``store.parked``), never in a spool file.
    """
    from jobbers_celery.install import install
    from jobbers_celery.jobbers import Jobbers

    found = Jobbers.find(app)
    if found is not None and isinstance(found.store, InMemoryStore) and store is None \
            and sink is None:
        return found
    if found is None:
        # never connected to (a unix URL: not even probed for a cluster at install)
        app.conf.setdefault("jobbers_redis_url", "unix:///nonexistent/jobbers-in-memory.sock")
        found = install(app)  # the signal handlers, worker steps and cleaner task, once
    # each JobbersTask builds its collaborators again for the new instance (worker/task.py)
    jobbers = Jobbers(app, found.config, store=store or InMemoryStore(),
                      sink=sink or InMemoryDeadLetterSink())
    jobbers.register()
    return jobbers
