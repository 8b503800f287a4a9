"""Errors as jobbers keeps and logs them.

:func:`describe_exception` is a task's exception as its record and its dead letter store it
(cut and redacted). :func:`refused_for_itself` tells an entry the sink refuses (it is set
aside) from a sink that is down (the entry waits). :func:`describe_error` is a sink's error as
the dispatcher logs it: never with the entry's arguments, checkpoint or exception message,
nor a credential.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from jobbers_celery.core import errortext
from jobbers_celery.core.errors import DeadLetterRefused
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.core.redaction import redactor
from jobbers_celery.store.errors import StoreValueError

__all__ = ["describe_error", "describe_exception", "describe_traceback", "refused_for_itself"]

#: Values shorter than this are not taken out of a logged sink error (too common to mean
#: anything; a shorter secret is not a secret).
_MIN_SCRUBBED = 4
_MAX_ERROR_CHARS = 500
#: Errors that are about the value written, never about the store being down.
_ENTRY_ERRORS = (DeadLetterRefused, ValueError, TypeError, RecursionError, OverflowError,
                 StoreValueError)


def refused_for_itself(exc: BaseException) -> bool:
    """Whether a sink's error is about the entry (a value its store refuses) rather than the
    store being unreachable: :class:`~jobbers_celery.DeadLetterRefused`, ``ValueError``
    (``UnicodeError`` and JSON errors included), ``TypeError``, ``RecursionError``,
    ``OverflowError`` and redis-py's ``DataError``. Anything else is taken for an outage:
    the entry waits, in order, as do the ones behind it."""
    return isinstance(exc, _ENTRY_ERRORS)


def describe_exception(exc: BaseException, message_max: int = errortext.MESSAGE_MAX_CHARS
                       ) -> tuple[str, str, str]:
    """(qualified type name, message, formatted traceback) of an exception, credentials
    taken out by look (what the record and the dead letter store: a task's own exception
    was redacted further, with its arguments' secret values, before it got here). Both cut
    first (:mod:`jobbers_celery.core.errortext`): the message's head (``message_max``
    characters), the traceback's end. Never raises: a ``__str__`` that raises is shown as
    :mod:`traceback` shows it (``<exception str() failed>``)."""
    cls = type(exc)
    module = cls.__module__
    name = (cls.__qualname__ if module in ("builtins", "__main__")
            else f"{module}.{cls.__qualname__}")
    redact = redactor().text
    message = errortext.safe_str(exc)
    try:
        parts = errortext.exception_parts(exc)
    except Exception:  # noqa: BLE001 - an exception odd enough to break the formatter
        parts = [f"{name}: {message}\n"]
    return (name, errortext.cut_message(message, redact, message_max),
            errortext.cut_traceback(parts, redact))


def describe_traceback(text: str) -> str:
    """A traceback formatted elsewhere (Celery's, of a lost pool child), cut and redacted as
    :func:`describe_exception` does."""
    return errortext.cut_traceback(text, redactor().text)


def describe_error(exc: BaseException, entries: Iterable[DeadLetter]) -> str:
    """``Type: message`` of a sink's (or Redis') error with the values of ``entries``
    (args, kwargs, checkpoint, publish options, exception message; 4 characters or more)
    taken out, cut to 500 characters: a database error may quote the row it refused.
    Never raises (it runs while an entry waits to be parked): the type alone if it would."""
    try:
        return _describe(exc, entries)
    except Exception:  # noqa: BLE001 - an odd exception or value: its type says enough
        return type(exc).__name__


def _describe(exc: BaseException, entries: Iterable[DeadLetter]) -> str:
    message = str(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    for value in sorted(_values(entries), key=len, reverse=True):
        if value in text:
            text = text.replace(value, "[redacted]")
    # and credentials by look: a database error may quote the sink's own connection URL
    text = redactor().text(text)
    if len(text) > _MAX_ERROR_CHARS:
        text = text[:_MAX_ERROR_CHARS] + "... [cut]"
    return text


def _values(entries: Iterable[DeadLetter]) -> set[str]:
    found: set[str] = set()
    for entry in entries:
        for part in (entry.args, entry.kwargs, entry.checkpoint, entry.options,
                     entry.exception_message):
            for leaf in _leaves(part):
                if len(leaf) >= _MIN_SCRUBBED:
                    found.add(leaf)
                    # as JSON or repr() would quote it inside a message
                    for form in (json.dumps(leaf)[1:-1], repr(leaf)[1:-1]):
                        if len(form) >= _MIN_SCRUBBED:
                            found.add(form)
    return found


def _leaves(value: Any, depth: int = 0) -> Iterator[str]:
    if depth > 32:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        yield str(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, depth + 1)
            if isinstance(key, str):
                yield key
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from _leaves(item, depth + 1)
    elif isinstance(value, bytes):
        yield value.decode("utf-8", "replace")
    else:
        yield str(value)
