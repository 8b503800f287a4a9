"""jobbers_celery.testing: test code that uses JobbersTask without a Redis server.

Why: a user's tests should check what their tasks do with heartbeats, checkpoints,
cancellation, retries and dead letters in milliseconds, on any machine. This module holds
public in-memory fakes of what jobbers keeps in Redis (in the manner of procrastinate's
``InMemoryConnector`` and dramatiq's ``StubBackend``), and :func:`in_memory`, which installs
jobbers on a Celery app with them.

- :class:`InMemoryStore`: the lifecycle steps, heartbeats, cancellation, reads and publish
  leases; each step checks the one transition table (``core/states.py``), so an illegal
  transition is refused as Redis refuses it.
- :class:`InMemoryDeadLetterSink`: the dead letters, in a list a test reads.
- :func:`in_memory`: ``install(app)`` with both; run the tasks on Celery's embedded worker
  (:func:`embedded_worker`, ``celery.contrib.testing.worker.start_worker`` or the
  ``celery_worker`` fixture) with the ``memory://`` broker.
- :func:`embedded_worker`: ``start_worker``, leaving the process as it found it. Not eager mode: an eager call (``task_always_eager``, ``apply()``)
  runs a JobbersTask untracked, as in production, so nothing would be recorded.

See ``docs/howto/testing.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

    Call it instead of ``install(app)``, or after it (an app your module installed: its
    services are rebuilt over the fakes; the Redis client it made is never used), before
    the app's first task is published in the test. The app needs no Redis: give it
    ``broker="memory://"`` and run its tasks on an embedded worker. Called again with new
    fakes, it starts the app over on them (one fresh store per test).
    """
    from jobbers_celery.install import install
    from jobbers_celery.jobbers import Jobbers

    found = Jobbers.find(app)
    current: object = getattr(found, "store", None)
    if found is not None and isinstance(current, InMemoryStore) and store is None \
            and sink is None:
        return found
    if found is None:
        # never connected to (a unix URL: not even probed for a cluster at install)
        app.conf.setdefault("jobbers_redis_url", "unix:///nonexistent/jobbers-in-memory.sock")
    jobbers = found or install(app)
    _rewire(jobbers, store or InMemoryStore(), sink or InMemoryDeadLetterSink())
    return jobbers


def _rewire(jobbers: Jobbers, store: InMemoryStore, sink: InMemoryDeadLetterSink) -> None:
    """Rebuild the services of ``jobbers`` over the fakes, as ``Jobbers`` builds them."""
    fake: Any = store  # ``Jobbers.store`` is the Redis store for everything else it does
    jobbers.store = fake
    jobbers.sink = sink
    jobbers._payload_sink = None  # paced resubmits need the Redis sink's runs
    jobbers.dead_letters.sink = sink
    jobbers.dead_letters._written = None
    jobbers.compose(store)  # the services, built as Jobbers builds them
    # Each JobbersTask keeps the collaborators it built from this instance's services
    # (worker/parts.py, rebuilt only for another instance): left, the next test's tasks
    # would start, heartbeat and end in the previous test's store (a cancel never seen,
    # the worker never stopping). Dropped, they are built again over the new fakes.
    for task in jobbers.app.tasks.values():
        vars(task).pop("_jobbers_parts", None)
