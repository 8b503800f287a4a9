"""What Celery shows of a task, redacted (:mod:`jobbers_celery.redaction` applied to Celery).

- Every publish (a client's ``apply_async``, a retry, the scheduler, a resubmission, a
  shutdown resubmit: all go through ``before_task_publish``) gets redacted ``argsrepr``
  and ``kwargsrepr`` headers, Celery's own mechanism for what its worker logs and task events
  (``task-received``, so Flower, ``celery inspect``) show of the arguments. The body keeps
  the real values: the task, and any republish of it, runs with them.
- An exception a task raises with a secret in its message gets that message redacted in
  place before Celery and jobbers see it, so the worker's log line and traceback, the
  ``task-failed``/``task-retried`` events, the result backend, the record and the dead
  letter all carry the redacted text (its string arguments are redacted; if that is not
  enough, the redacted message becomes its only argument).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery, Task
from celery.utils.saferepr import saferepr

from jobbers_celery.config import JobbersConfig
from jobbers_celery.redaction import Parameters, Redactor, parameters, redactor

__all__ = ["redact_exception", "redact_headers", "redactor_of", "sent_reprs", "task_parameters"]

log = logging.getLogger("jobbers.redaction")

#: Exceptions followed along ``__cause__``/``__context__``.
_MAX_CHAIN = 16
#: Characters of Celery's repr compared to tell it from a caller's own.
_PROBE = 96
#: The parameters of each task object, read once (``inspect.signature`` is not free).
_PARAMETERS: weakref.WeakKeyDictionary[Any, Parameters | None] = weakref.WeakKeyDictionary()


def redactor_of(config: JobbersConfig) -> Redactor:
    return redactor(tuple(config.redact_keys))


def task_parameters(task: Task[Any, Any] | None) -> Parameters | None:
    """The positional parameters of a registered task (``run``: bound for ``bind=True``
    tasks and class-based ones, so ``self`` is left out); read once per task object."""
    if task is None:
        return None
    try:
        return _PARAMETERS[task]
    except (KeyError, TypeError):
        pass
    run = getattr(task, "run", None)
    found = parameters(run) if run is not None else None
    with contextlib.suppress(TypeError):  # not weakly referenceable: read each time
        _PARAMETERS[task] = found
    return found


def redact_headers(app: Celery, task: Task[Any, Any] | None, headers: dict[str, Any],
                   body: Any, redact: Redactor) -> None:
    """Replace a protocol-2 message's ``argsrepr``/``kwargsrepr`` by redacted ones (an
    ``argsrepr`` passed to ``apply_async`` is kept, its text redacted)."""
    if "argsrepr" not in headers and "kwargsrepr" not in headers:
        return  # protocol 1: no reprs
    if not isinstance(body, list | tuple) or len(body) < 2:
        return
    args, kwargs = body[0], body[1]
    if not isinstance(args, Sequence) or isinstance(args, str) or not isinstance(kwargs, Mapping):
        return
    amqp = app.amqp
    shown_args, shown_kwargs = redact.arguments(
        args, kwargs, task_parameters(task),
        limit=2 * max(amqp.argsrepr_maxsize, amqp.kwargsrepr_maxsize))
    for header, real, shown, size in (("argsrepr", args, shown_args, amqp.argsrepr_maxsize),
                                      ("kwargsrepr", kwargs, shown_kwargs,
                                       amqp.kwargsrepr_maxsize)):
        given = headers.get(header)
        if shown == (list(real) if header == "argsrepr" else dict(real)):
            # nothing secret in the values (the usual case: no repr made twice); a repr of
            # the caller's own may still say something
            if isinstance(given, str):
                headers[header] = redact.text(given)
            continue
        levels = app.conf.task_repr_maxlevels
        if isinstance(given, str) and not _is_celerys(given, real, levels):
            headers[header] = redact.text(given)  # the caller's own repr
        else:
            headers[header] = saferepr(shown, size, maxlevels=levels)


def sent_reprs(app: Celery, task: Task[Any, Any], args: Any, kwargs: Any,
               redact: Redactor) -> tuple[str, str] | None:
    """Redacted ``argsrepr``/``kwargsrepr`` to pass to ``apply_async``, for the ``task-sent``
    event (``task_send_sent_event``), which Celery builds before ``before_task_publish``;
    ``None`` when the arguments hold nothing to hide (Celery makes its own reprs)."""
    args = () if args is None else args
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(args, Sequence) or isinstance(args, str) or not isinstance(kwargs, Mapping):
        return None
    amqp = app.amqp
    shown_args, shown_kwargs = redact.arguments(
        args, kwargs, task_parameters(task),
        limit=2 * max(amqp.argsrepr_maxsize, amqp.kwargsrepr_maxsize))
    if shown_args == list(args) and shown_kwargs == dict(kwargs):
        return None
    levels = app.conf.task_repr_maxlevels
    return (saferepr(shown_args, amqp.argsrepr_maxsize, maxlevels=levels),
            saferepr(shown_kwargs, amqp.kwargsrepr_maxsize, maxlevels=levels))


def _is_celerys(given: str, real: Any, levels: int) -> bool:
    """Whether ``given`` is the repr Celery made of ``real`` (not one passed to
    ``apply_async``): compared on a short repr, as Celery's is costly on big values."""
    probe = saferepr(real, _PROBE, maxlevels=levels)
    if len(probe) < _PROBE - 8:  # the whole repr
        return given == probe
    return given.startswith(probe[:_PROBE // 2])


def redact_exception(exc: BaseException, task: Task[Any, Any], args: Any, kwargs: Any,
                     redact: Redactor) -> None:
    """Redact, in place, the message of ``exc`` and of the exceptions it chains: credentials
    and the secret values of the task's own arguments. Never raises."""
    try:
        known = redact.secrets(args if isinstance(args, Sequence) else (),
                               kwargs if isinstance(kwargs, Mapping) else {},
                               task_parameters(task))
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen and len(seen) < _MAX_CHAIN:
            seen.add(id(current))
            _redact_one(current, redact, known)
            current = current.__cause__ or current.__context__
    except Exception:  # an odd exception: shown as it is rather than lost
        log.debug("could not redact the message of %r", type(exc), exc_info=True)


def _redact_one(exc: BaseException, redact: Redactor, known: frozenset[str]) -> None:
    notes = getattr(exc, "__notes__", None)  # add_note(): printed with the traceback
    if isinstance(notes, list):
        exc.__notes__ = [redact.text(n, known) if isinstance(n, str) else n for n in notes]
    text = str(exc)
    if redact.text(text, known) == text:
        return
    # each string argument redacted (the exception keeps its shape: KeyError, OSError...)
    exc.args = tuple(redact.text(a, known) if isinstance(a, str) else a for a in exc.args)
    now = str(exc)
    if redact.text(now, known) != now:  # a secret outside its string arguments
        exc.args = (redact.text(now, known),)
        if str(exc) != exc.args[0]:  # a __str__ of its own, from attributes
            log.debug("%s keeps its own message text", type(exc).__name__)
