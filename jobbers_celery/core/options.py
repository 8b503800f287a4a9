"""Per-task options: their enums, defaults and validation. Pure.

Validation runs when the task class is created, so a typo in a decorator fails at import
time instead of on the first failure in production.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any, TypeVar

from jobbers_celery.core.backoff import BackoffStrategy
from jobbers_celery.core.errors import InvalidTaskOption
from jobbers_celery.core.fairshare import ConcurrencyKey, validate_concurrency_key
from jobbers_celery.core.ratelimit import RateLimit, validate_rate_limit
from jobbers_celery.core.unique import Unique, validate_unique

__all__ = [
    "OPTION_NAMES",
    "DeadLetterPolicy",
    "ResubmitVersion",
    "ShutdownPolicy",
    "TaskOptions",
    "WorkerLostPolicy",
    "validate_options",
]


class DeadLetterPolicy(StrEnum):
    NONE = "none"
    SAVE = "save"


class ShutdownPolicy(StrEnum):
    STOP = "stop"
    RESUBMIT = "resubmit"
    CONTINUE = "continue"


class WorkerLostPolicy(StrEnum):
    """What becomes of a task whose worker process was lost while it ran (a prefork pool
    process killed: SIGKILL, the OOM killer), with ``acks_late`` (its message is still
    unacknowledged): Celery's ``reject_on_worker_lost`` requeues it, or not.

    ``RERUN``: the message is requeued and the task runs again, as Celery does with
    ``reject_on_worker_lost``; the record goes ``started -> unsubmitted -> submitted`` with a
    reason naming the lost worker, and the redelivered copy's start is the next attempt.
    ``FAIL``: it is not requeued even if ``reject_on_worker_lost`` is set: Celery stores
    FAILURE (``WorkerLostError``), the record says ``failed`` with it, and the task is
    dead-lettered per ``dead_letter_policy``. The default (``None``) follows Celery:
    ``RERUN`` when the task sets ``reject_on_worker_lost`` (``task_reject_on_worker_lost``),
    ``FAIL`` otherwise. Without ``acks_late`` the message was acknowledged when the task
    started: nothing can be requeued, and the task fails whatever this says.
    """

    RERUN = "rerun"
    FAIL = "fail"


class ResubmitVersion(StrEnum):
    """Which version a resubmitted task is published as.

    ``ENTRY`` (the default): the version it was published and failed with, so a worker
    running another version drops it again rather than call new code with arguments made
    for the old signature. ``CURRENT``: the version registered for its name in the
    resubmitting process's app (the code the workers now run, once deployed everywhere).
    """

    ENTRY = "entry"
    CURRENT = "current"


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """The validated jobbers options of one task type (Celery's ``max_retries`` included)."""

    version: int = 1
    max_retries: int | None = 3
    retry_delay: float | None = None
    backoff_strategy: BackoffStrategy = BackoffStrategy.EXPONENTIAL
    max_retry_delay: float = 3600.0
    expected_exceptions: tuple[type[BaseException], ...] = ()
    timeout: float | None = None
    dead_letter_policy: DeadLetterPolicy = DeadLetterPolicy.NONE
    max_heartbeat_interval: float | None = None
    on_shutdown: ShutdownPolicy = ShutdownPolicy.STOP
    max_concurrent: int | None = None
    max_stall_recoveries: int = 0
    on_worker_lost: WorkerLostPolicy | None = None
    unique: Unique | None = None
    rate_limit_by: RateLimit | None = None
    concurrency_key: ConcurrencyKey | None = None


OPTION_NAMES: frozenset[str] = frozenset(TaskOptions.__dataclass_fields__)


def _seconds(name: str, value: Any, *, allow_none: bool, positive: bool = False) -> float | None:
    if value is None:
        if allow_none:
            return None
        raise InvalidTaskOption(f"{name} must be a number of seconds, not None")
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTaskOption(
            f"{name} must be a number of seconds or a timedelta, got {value!r}"
        )
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise InvalidTaskOption(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def _count(name: str, value: Any, *, allow_none: bool, minimum: int) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidTaskOption(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


E = TypeVar("E", bound=StrEnum)


def _enum(name: str, enum: type[E], value: Any) -> E:
    try:
        return enum(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in enum)
        raise InvalidTaskOption(f"{name} must be one of {choices}, got {value!r}") from None


def _exceptions(value: Any) -> tuple[type[BaseException], ...]:
    items = (value,) if isinstance(value, type) else value
    if not isinstance(items, tuple | list | set | frozenset):
        raise InvalidTaskOption(
            f"expected_exceptions must be a tuple of exception classes, got {value!r}"
        )
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise InvalidTaskOption(
                f"expected_exceptions must contain exception classes only, got {item!r}"
            )
    return tuple(items)


def validate_options(raw: Mapping[str, Any]) -> TaskOptions:
    """Turn the attributes of a task class into :class:`TaskOptions`, or raise clearly.

    Unknown keys are ignored: ``raw`` is usually every attribute of a Celery task class.
    """
    d = TaskOptions()
    get = raw.get
    max_concurrent = _count("max_concurrent", get("max_concurrent"), allow_none=True, minimum=1)
    return TaskOptions(
        version=_count("version", get("version", d.version), allow_none=False, minimum=0)
        or 0,
        max_retries=_count("max_retries", get("max_retries", d.max_retries), allow_none=True,
                           minimum=0),
        retry_delay=_seconds("retry_delay", get("retry_delay"), allow_none=True),
        backoff_strategy=_enum("backoff_strategy", BackoffStrategy,
                               get("backoff_strategy", d.backoff_strategy)),
        max_retry_delay=_seconds("max_retry_delay", get("max_retry_delay", d.max_retry_delay),
                                 allow_none=False) or 0.0,
        expected_exceptions=_exceptions(get("expected_exceptions", ())),
        timeout=_seconds("timeout", get("timeout"), allow_none=True, positive=True),
        dead_letter_policy=_enum("dead_letter_policy", DeadLetterPolicy,
                                 get("dead_letter_policy", d.dead_letter_policy)),
        max_heartbeat_interval=_seconds("max_heartbeat_interval",
                                        get("max_heartbeat_interval"), allow_none=True,
                                        positive=True),
        on_shutdown=_enum("on_shutdown", ShutdownPolicy, get("on_shutdown", d.on_shutdown)),
        max_concurrent=max_concurrent,
        unique=validate_unique(get("unique")),
        max_stall_recoveries=_count("max_stall_recoveries",
                                    get("max_stall_recoveries", d.max_stall_recoveries),
                                    allow_none=False, minimum=0) or 0,
        on_worker_lost=(None if get("on_worker_lost") is None
                        else _enum("on_worker_lost", WorkerLostPolicy, get("on_worker_lost"))),
        rate_limit_by=validate_rate_limit(get("rate_limit_by")),
        concurrency_key=validate_concurrency_key(get("concurrency_key"), max_concurrent),
    )
