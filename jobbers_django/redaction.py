"""Secrets are shown redacted wherever people read them (admin, API), and long values cut.

The redaction is jobbers_celery's (:class:`jobbers_celery.Redactor`), the one that also
redacts Celery's ``argsrepr``/``kwargsrepr`` and task exceptions in the worker: values under
keys that match ``JOBBERS_REDACT_KEYS`` (case-insensitive, whatever the separators or camel
case, at any depth; unset: the Celery app's ``jobbers_redact_keys``), positional arguments
whose parameter (of the task registered in this process's Celery app) has such a name, and
credentials in any string (a URL's user part, the token after ``Bearer``/``Basic``/``Token``
and other schemes, ``password=...``). Exception messages and tracebacks lose those
credentials and the secret values of the entry's own arguments.

Only the display is redacted and cut: the stored arguments stay whole, because resubmission
needs the real values. A value whose JSON is longer than ``JOBBERS_DISPLAY_MAX_CHARS`` is cut
to about that many characters, keeping its shape (a list stays a list): long strings end
with, and lists and dicts gain, a ``[cut for display: ...]`` marker saying how much there was.
The cut comes first: a value is redacted only as far as it is shown (plus a margin, so that a
secret the cut goes through is still whole when it is redacted), so a page costs the same
whatever the size of what is stored.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from jobbers_celery import (
    DEFAULT_REDACT_KEYS,
    REDACTED,
    Parameters,
    Redactor,
    TaskRecord,
    Transition,
    WorkflowTransition,
    redactor,
    storable_value,
    task_parameters,
)
from jobbers_django import conf

__all__ = ["CUT", "REDACTED", "arguments", "current", "display", "redact", "shown",
           "shown_arguments", "text"]

_Read = TypeVar("_Read", TaskRecord, Transition, WorkflowTransition)

#: What a cut value says, with how much it held.
CUT = "[cut for display: {}]"


def current() -> Redactor:
    """The redactor of ``JOBBERS_REDACT_KEYS`` (unset: the Celery app's
    ``jobbers_redact_keys``, else the defaults)."""
    keys = conf.get("REDACT_KEYS")
    if keys is None:
        try:
            from jobbers_django.bridge import get_jobbers

            keys = get_jobbers().config.redact_keys
        except Exception:  # noqa: BLE001 - no app installed here: the defaults
            keys = DEFAULT_REDACT_KEYS
    return redactor(tuple(keys))


def redact(value: Any) -> Any:
    """A copy of ``value`` with its secrets replaced (keys, credentials in strings)."""
    return current().value(value)


def _parameters(task_name: str | None) -> Parameters | None:
    if not task_name:
        return None
    try:
        from jobbers_django.bridge import get_app

        return task_parameters(get_app().tasks.get(task_name))
    except Exception:  # noqa: BLE001 - the app cannot be loaded: keys and patterns only
        return None


def arguments(task_name: str | None, args: Any,
              kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """A task's ``args`` and ``kwargs`` as shown: positional ones matched to the parameter
    names of the task of that name, if this process's Celery app has it. Arguments sealed
    at rest are opened first where this process holds the key, else shown as encrypted."""
    from jobbers_django.bridge import readable_arguments

    args, kwargs = readable_arguments(args, kwargs)
    return current().arguments(args if isinstance(args, Sequence) else [],
                               kwargs if isinstance(kwargs, Mapping) else {},
                               _parameters(task_name))


def text(value: str | None, task_name: str | None = None, args: Any = None,
         kwargs: Any = None) -> str:
    """An exception message or traceback as shown: credentials taken out, and the secret
    values of the task's arguments (when given)."""
    if not value:
        return value or ""
    red = current()
    known = red.secrets(args if isinstance(args, Sequence) else [],
                        kwargs if isinstance(kwargs, Mapping) else {},
                        _parameters(task_name)) if args or kwargs else frozenset()
    return red.text(value, known)


def shown(read: _Read) -> _Read:
    """A record (its error message) or a transition, a task's or a workflow's (its reason),
    as shown: credentials taken out by look (the worker took out the secret values of the
    task's arguments already), and what a task put in it (its error, progress, checkpoint)
    in a form every page renders: NUL and lone surrogates escaped, NaN as a string
    (``storable_value``; a lone surrogate made the task page answer 500)."""
    if isinstance(read, TaskRecord):
        error = read.error
        if error is not None:
            error = dataclasses.replace(
                error, type=storable_value(error.type),
                message=text(storable_value(error.message)) if error.message else error.message)
        return dataclasses.replace(read, error=error, progress=storable_value(read.progress),
                                   checkpoint=storable_value(read.checkpoint))
    return dataclasses.replace(read, reason=text(storable_value(read.reason))) \
        if read.reason else read


def display(value: Any, limit: int | None = None, *,
            redacted: bool = False) -> tuple[Any, bool]:
    """``value`` as people see it: redacted (unless ``redacted`` says it is already) and
    cut to about ``limit`` characters of JSON (default ``JOBBERS_DISPLAY_MAX_CHARS``; 0:
    never cut), in one walk that looks at no more than it shows. Returns it and whether it
    was cut."""
    limit = conf.get("DISPLAY_MAX_CHARS") if limit is None else limit
    if not redacted:
        return current().display(value, int(limit or 0), CUT)
    if not limit or len(json.dumps(value, ensure_ascii=False, default=str)) <= limit:
        return value, False
    return _cut(value, [int(limit)]), True


def shown_arguments(task_name: str | None, args: Any, kwargs: Any,
                    limit: int | None = None) -> tuple[list[Any], dict[str, Any], bool, bool]:
    """:func:`arguments` as :func:`display` shows them: each redacted and cut to ``limit``
    (default ``JOBBERS_DISPLAY_MAX_CHARS``) in one walk that looks at no more than it
    shows; returns both and whether each was cut."""
    from jobbers_django.bridge import readable_arguments

    limit = conf.get("DISPLAY_MAX_CHARS") if limit is None else limit
    args, kwargs = readable_arguments(args, kwargs)
    return current().display_arguments(args if isinstance(args, Sequence) else [],
                                       kwargs if isinstance(kwargs, Mapping) else {},
                                       _parameters(task_name), int(limit or 0), CUT)


def _cut(value: Any, left: list[int]) -> Any:
    """``value`` within the characters ``left[0]`` still allows (and what it used taken off)."""
    if isinstance(value, str):
        if len(value) + 4 <= left[0]:  # quotes and the ", " after it
            left[0] -= len(value) + 4
            return value
        keep, left[0] = max(left[0] - 2, 0), 0
        return value[:keep] + "... " + CUT.format(f"{len(value):,} characters in all")
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for n, (key, item) in enumerate(value.items()):
            if left[0] <= 0:
                out["..."] = CUT.format(_more(len(value) - n, "key"))
                break
            left[0] -= len(str(key)) + 4
            out[key] = _cut(item, left)
        return out
    if isinstance(value, list | tuple):
        items: list[Any] = []
        for n, item in enumerate(value):
            if left[0] <= 0:
                items.append("... " + CUT.format(_more(len(value) - n, "item")))
                break
            items.append(_cut(item, left))
        return items
    left[0] -= len(json.dumps(value, default=str)) + 2  # and the ", " after it
    return value


def _more(n: int, what: str) -> str:
    return f"{n:,} more {what}{'' if n == 1 else 's'}"
