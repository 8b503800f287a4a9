"""install(app): wire jobbers into a Celery app, once."""

from __future__ import annotations

import functools
import threading
from typing import Any

from celery import Celery

from jobbers_celery import signals
from jobbers_celery.config import JobbersConfig
from jobbers_celery.errors import ConfigurationError
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.options import OPTION_NAMES, validate_options
from jobbers_celery.scheduler import SchedulerStep

__all__ = ["get_jobbers", "install"]

_lock = threading.Lock()


def install(app: Celery) -> Jobbers:
    """Install jobbers on ``app`` (idempotent) and return its :class:`Jobbers`.

    Reads the ``jobbers_*`` settings, connects the signal handlers, adds the scheduler to
    the app's workers and makes ``@app.task(base=JobbersTask, ...)`` validate its options
    when the decorator runs.
    """
    with _lock:
        existing: Jobbers | None = getattr(app, "_jobbers", None)
        if existing is not None:
            return existing
        config = JobbersConfig.from_mapping(app.conf, app.conf.broker_url)
        jobbers = Jobbers(app, config)
        app._jobbers = jobbers  # type: ignore[attr-defined]
        signals.register(jobbers)
        signals.connect()
        app.steps["worker"].add(SchedulerStep)
        _validate_on_declaration(app)
        return jobbers


def get_jobbers(app: Celery) -> Jobbers:
    """The :class:`Jobbers` that ``install(app)`` returned."""
    jobbers: Jobbers | None = getattr(app, "_jobbers", None)
    if jobbers is None:
        raise ConfigurationError(f"jobbers is not installed on {app!r}: call install(app)")
    return jobbers


def _validate_on_declaration(app: Celery) -> None:
    """Celery creates task classes lazily; check jobbers options when the decorator runs."""
    from jobbers_celery.task import JobbersTask

    original = app.task

    @functools.wraps(original)
    def task(*args: Any, **opts: Any) -> Any:
        base = opts.get("base")
        if isinstance(base, type) and issubclass(base, JobbersTask):
            validate_options({**{n: getattr(base, n) for n in OPTION_NAMES}, **opts})
        return original(*args, **opts)

    app.task = task  # type: ignore[method-assign]
