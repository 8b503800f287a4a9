"""Option validation happens when a task is declared, without any network."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import Celery

from jobbers_celery import (
    BackoffStrategy,
    DeadLetterPolicy,
    InvalidTaskOption,
    JobbersTask,
    ShutdownPolicy,
    WorkerLostPolicy,
    install,
)
from jobbers_celery.core.options import TaskOptions, validate_options


@pytest.fixture
def app():
    # install() builds a Redis client but does not connect: no network needed here.
    app = Celery("unit", broker="redis://127.0.0.1:1/0")
    install(app)
    return app


def test_defaults_are_the_documented_ones():
    assert validate_options({}) == TaskOptions(
        version=1, max_retries=3, retry_delay=None,
        backoff_strategy=BackoffStrategy.EXPONENTIAL, max_retry_delay=3600.0,
        expected_exceptions=(), timeout=None, dead_letter_policy=DeadLetterPolicy.NONE,
        max_heartbeat_interval=None, on_shutdown=ShutdownPolicy.STOP, max_concurrent=None,
        max_stall_recoveries=0)


def test_good_options_are_normalised(app):
    @app.task(base=JobbersTask, bind=True, version=2, max_retries=5, retry_delay=10,
              backoff_strategy="exponential_jitter", max_retry_delay=timedelta(minutes=5),
              expected_exceptions=(ConnectionError,), timeout=600, dead_letter_policy="save",
              max_heartbeat_interval=timedelta(seconds=60), on_shutdown="resubmit",
              max_concurrent=4, max_stall_recoveries=2)
    def import_catalog(self, url):
        return url

    opts = import_catalog.jobbers_options
    assert opts.backoff_strategy is BackoffStrategy.EXPONENTIAL_JITTER
    assert opts.max_retry_delay == 300.0
    assert opts.max_heartbeat_interval == 60.0
    assert opts.dead_letter_policy is DeadLetterPolicy.SAVE
    assert opts.on_shutdown is ShutdownPolicy.RESUBMIT
    assert import_catalog.soft_time_limit == 600  # timeout is enforced by prefork


@pytest.mark.parametrize(("options", "message"), [
    ({"retry_delay": -1}, "retry_delay must be a finite number >= 0"),
    ({"retry_delay": "ten"}, "retry_delay must be a number of seconds"),
    ({"max_retry_delay": float("inf")}, "max_retry_delay must be a finite number"),
    ({"backoff_strategy": "fibonacci"}, "backoff_strategy must be one of"),
    ({"on_worker_lost": "retry"}, "on_worker_lost must be one of 'rerun', 'fail'"),
    ({"expected_exceptions": (ValueError, "KeyError")}, "exception classes only"),
    ({"expected_exceptions": ValueError("x")}, "tuple of exception classes"),
    ({"expected_exceptions": (int,)}, "exception classes only"),
    ({"timeout": 0}, "timeout must be a finite number > 0"),
    ({"dead_letter_policy": "keep"}, "dead_letter_policy must be one of"),
    ({"on_shutdown": "restart"}, "on_shutdown must be one of"),
    ({"max_concurrent": 0}, "max_concurrent must be an integer >= 1"),
    ({"max_retries": -1}, "max_retries must be an integer >= 0"),
    ({"version": "2"}, "version must be an integer"),
    ({"max_stall_recoveries": True}, "max_stall_recoveries must be an integer"),
    ({"max_heartbeat_interval": timedelta(0)}, "max_heartbeat_interval must be"),
])
def test_bad_options_fail_when_the_task_is_declared(app, options, message):
    with pytest.raises(InvalidTaskOption, match=message):
        @app.task(base=JobbersTask, **options)
        def bad():
            return None


def test_subclassing_validates_too():
    with pytest.raises(InvalidTaskOption, match="retry_delay"):
        class Broken(JobbersTask):
            retry_delay = -5


def test_a_single_exception_class_is_accepted():
    assert validate_options({"expected_exceptions": KeyError}).expected_exceptions == (KeyError,)


def test_install_is_idempotent_and_get_jobbers_returns_it(app):
    from jobbers_celery import get_jobbers

    assert install(app) is get_jobbers(app)


def test_get_jobbers_without_install_is_a_clear_error():
    from jobbers_celery import ConfigurationError, get_jobbers

    with pytest.raises(ConfigurationError, match="install"):
        get_jobbers(Celery("x"))


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("rerun", WorkerLostPolicy.RERUN), ("fail", WorkerLostPolicy.FAIL),
    (WorkerLostPolicy.FAIL, WorkerLostPolicy.FAIL)])
def test_on_worker_lost_is_normalised(app, value, expected):
    @app.task(base=JobbersTask, bind=True, acks_late=True, on_worker_lost=value, shared=False,
              name=f"lost_{value}")
    def lost(self):
        return None

    assert lost.jobbers_options.on_worker_lost is expected
