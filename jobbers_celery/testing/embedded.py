"""Celery's embedded worker for a test, leaving the process as it found it.

Why: a stopped worker leaves process-wide state behind: jobbers' "the worker is shutting
down" flag (set at its shutdown so that running tasks stop; the next worker clears it, but
a test that pushes a request or heartbeats without a worker sees it and every
``heartbeat()`` raises ``WorkerShuttingDown``), and the logging Celery set up for it (the
root logger's level and handlers: later tests' warnings go nowhere).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from celery.contrib.testing.worker import start_worker

from jobbers_celery.worker import shutdown

if TYPE_CHECKING:
    from celery import Celery
    from celery.worker import WorkController

__all__ = ["embedded_worker"]


@contextmanager
def embedded_worker(app: Celery, **options: Any) -> Iterator[WorkController]:
    """``celery.contrib.testing.worker.start_worker(app, **options)`` (default: the solo
    pool, no ping check), then the shutting-down flag cleared
    and the root logger's level and handlers as they were before it started."""
    options.setdefault("pool", "solo")
    options.setdefault("perform_ping_check", False)
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    try:
        with start_worker(app, **options) as worker:  # its terminate stops jobbers' threads
            yield worker
    finally:
        shutdown.on_worker_init()  # the stopped worker's shutdown is not the process's
        root.setLevel(level)
        root.handlers[:] = handlers
