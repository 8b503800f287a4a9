"""Celery's own log records, redacted at every level (a filter on Celery's loggers).

Celery logs a task's arguments and exceptions in places jobbers does not build: at DEBUG,
``TaskPool: Apply`` prints the whole request handed to the pool (arguments, headers, body);
``Received task``, the failure line and the invalid or unknown message lines quote reprs,
exceptions and bodies. :func:`install` puts :class:`RedactingFilter` on those loggers (a
logger's filter applies to every record made on it, whatever handlers the application
configures) and on the handlers Celery's worker sets up (so a record of any other ``celery.*``
or ``kombu.*`` logger, a task's own logger included, is redacted there too): the pool line's arguments are replaced by a note (the request's redacted reprs
are in the ``Received task`` line and the task events), and every other record's message
(formatted with its arguments), extra ``data`` and traceback text are redacted as text
(credentials, values of secret keys), and shown with their control characters escaped (the
arguments' strings wholly, newlines included: a task id or name is a publisher's; the rest
keeps Celery's own line breaks). A record is never dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from celery import signals

from jobbers_celery.core.printable import printable, unprintable
from jobbers_celery.core.redaction import Redactor, redactor

__all__ = ["CELERY_LOGGERS", "HIDDEN", "RedactingFilter", "install"]

#: The loggers whose records may quote a task's arguments, body or exception.
CELERY_LOGGERS = (
    "celery", "celery.pool", "celery.worker.strategy", "celery.app.trace",
    "celery.worker.request", "celery.worker.consumer", "celery.worker.consumer.consumer",
    "celery.worker.consumer.gossip", "celery.worker.control", "celery.worker.state",
    "celery.worker.autoscale", "celery.concurrency.asynpool", "celery.redirected",
    "celery.beat", "celery.app.base", "celery.backends", "celery.backends.base",
    "kombu", "kombu.messaging",
)
#: What the pool's ``Apply`` line shows instead of the request it hands to the pool.
HIDDEN = "[not shown by jobbers: see the task's Received line]"
_POOL_APPLY = "TaskPool: Apply"
_PREFIXES = ("celery", "kombu")
_DONE = "jobbers_redacted"


class RedactingFilter(logging.Filter):
    """Redacts a record in place (see the module); ``get`` gives the redactor (the
    process's key list, read at each record: an app installed later adds its keys)."""

    def __init__(self, get: Callable[[], Redactor] = redactor) -> None:
        super().__init__()
        self._get = get

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _DONE, False) or not record.name.startswith(_PREFIXES):
            return True  # redacted already (by its logger), or not Celery's
        setattr(record, _DONE, True)
        try:
            self._redact(record)
        except Exception:  # noqa: BLE001 - logging must go on; the record keeps its args
            record.args = ()
            record.msg = f"[log record not shown: could not redact it] {record.name}"
        return True

    def _redact(self, record: logging.LogRecord) -> None:
        red = self._get()
        if isinstance(record.msg, str) and record.msg.startswith(_POOL_APPLY):
            args = record.args if isinstance(record.args, tuple) else ()
            record.args = (args[0] if args else "?", HIDDEN, HIDDEN)
            return
        # a publisher's values in the arguments (a task id with a newline forged a line, a
        # name with ESC reached the terminal) shown escaped, then the message as it will
        # read, redacted whole (an argument's repr included) and any control character left
        # in it escaped (Celery's own text keeps its line breaks)
        record.args = _escaped_args(record.args)
        record.msg = _controls_escaped(red.text(record.getMessage()))
        record.args = ()
        data = getattr(record, "data", None)
        if isinstance(data, Mapping):
            record.data = {k: _shown(v, red) for k, v in data.items()}
        if record.exc_info and not record.exc_text:
            record.exc_text = _controls_escaped(
                red.text(logging.Formatter().formatException(record.exc_info)))
        elif record.exc_text:
            record.exc_text = _controls_escaped(red.text(record.exc_text))


def _escaped_args(args: Any) -> Any:
    """A record's arguments with every string shown through :func:`printable`."""
    if isinstance(args, Mapping):
        return {k: printable(v) if isinstance(v, str) else v for k, v in args.items()}
    if isinstance(args, tuple):
        return tuple(printable(v) if isinstance(v, str) else v for v in args)
    return args


def _controls_escaped(text: str) -> str:
    """``text`` with what a terminal could obey escaped, its line breaks and backslashes
    kept (Celery's multi-line messages, tracebacks, and arguments escaped already)."""
    unsafe = unprintable(text) - {"\n"}
    return text.translate({ord(c): printable(c) for c in unsafe}) if unsafe else text


def _shown(value: Any, red: Redactor) -> Any:
    if isinstance(value, str):
        return red.text(value)
    if isinstance(value, bytes | Mapping | list | tuple):
        return red.value(value)
    return value


_FILTER = RedactingFilter()


def install() -> None:
    """Put the filter on Celery's loggers, and on the handlers of the loggers the worker sets
    up (``after_setup_logger``: so a record of any ``celery.*`` logger is redacted there);
    idempotent."""
    for name in CELERY_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    signals.after_setup_logger.connect(_on_logging_set_up, weak=False,
                                       dispatch_uid="jobbers.logfilter.logger")
    signals.after_setup_task_logger.connect(_on_logging_set_up, weak=False,
                                            dispatch_uid="jobbers.logfilter.task_logger")


def _on_logging_set_up(logger: logging.Logger | None = None, **_: Any) -> None:
    for handler in getattr(logger, "handlers", ()):
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
