"""What Celery shows of a task, redacted (:mod:`jobbers_celery.core.redaction` applied to Celery).

- The worker recomputes a message's ``argsrepr`` and ``kwargsrepr`` from its decoded body
  (:func:`worker_reprs`, called as the request is made): whoever published it (a client
  without jobbers, a protocol 1 message, a header that lies), what the worker shows of the
  arguments (its ``Received task`` log line, the ``task-received`` event, so Flower,
  ``celery inspect active/reserved/scheduled``, its failure log line) is redacted.
- Every publish through jobbers (a client's ``apply_async``, a retry, the scheduler, a
  resubmission, a shutdown resubmit: all go through ``before_task_publish``) gets redacted
  ``argsrepr`` and ``kwargsrepr`` headers too, for the ``task-sent`` event and for workers
  of other versions. The body keeps the real values: the task, and any republish of it,
  runs with them.
- An exception a task raises with a secret in it is redacted in place before Celery and
  jobbers see it: its string arguments, its attributes (a message ``__str__`` builds from
  ``self.url``), its notes, the exceptions it chains and every member of an exception group
  (breadth-first, up to :data:`_MAX_EXCEPTIONS`; any further one is blanked), and the
  fields ``str()`` reads (an OSError's ``strerror`` and file names, a UnicodeError's
  ``reason``). So the worker's log line (which shows its ``repr()``) and traceback, the
  ``task-failed``/``task-retried`` events, the result
  backend, the record and the dead letter all carry the redacted text.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery, Task
from celery.utils.saferepr import saferepr

from jobbers_celery.core import reprcut
from jobbers_celery.core.config import JobbersConfig
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.redaction import REDACTED, Parameters, Redactor, parameters, redactor

__all__ = ["celery_reprs", "redact_exception", "redact_headers", "redactor_of", "sent_reprs",
           "task_parameters", "worker_reprs"]

log = escaped_logger("jobbers.redaction")

#: Exceptions visited in one redaction (along ``__cause__``/``__context__`` and into
#: exception groups).
_MAX_EXCEPTIONS = 256
#: Levels of exception groups visited.
_MAX_GROUP_DEPTH = 16
#: What an exception past those limits shows instead of its arguments and attributes.
PAST_LIMIT = "[not shown: past the exceptions jobbers redacts]"
#: What a value the redactor refuses (cyclic, nested too deep, too big) shows instead.
REFUSED = "[not shown: cyclic, nested too deep or too big to redact]"
#: Containers looked into, at most, in one argument or attribute of an exception.
_MAX_NODES = 10_000
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
    if not ((type(args) is tuple or type(args) is list) and type(kwargs) is dict) and (
            not isinstance(args, Sequence) or isinstance(args, str)
            or not isinstance(kwargs, Mapping)):
        return
    params = task_parameters(task)
    amqp = app.amqp
    limit = 2 * max(amqp.argsrepr_maxsize, amqp.kwargsrepr_maxsize)
    if redact.shown_unchanged(args, kwargs, params, limit):
        # nothing in what the reprs show can be secret (a bulk fan-out's usual arguments:
        # numbers, names, no walk, no repr made again); a repr the caller passed, or a
        # pattern Celery's repr forms across values, may still say something
        for header in ("argsrepr", "kwargsrepr"):
            given = headers.get(header)
            if isinstance(given, str):
                headers[header] = redact.text(given)
        return
    shown_args, shown_kwargs = redact.arguments(args, kwargs, params, limit=limit)
    for header, real, shown, size in (("argsrepr", args, shown_args, amqp.argsrepr_maxsize),
                                      ("kwargsrepr", kwargs, shown_kwargs,
                                       amqp.kwargsrepr_maxsize)):
        given = headers.get(header)
        if _same(shown, real):
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


def _same(shown: Any, real: Any) -> bool:
    """Whether the redaction walk showed ``real`` whole and unchanged: equal, a tuple shown
    as a list (JSON's form) counted equal; anything replaced, cut or converted otherwise
    (a set, an object shown as text, a key redacted) is not. Then Celery's own repr of it
    hides nothing, and is not made again (a ``chunks`` message's pairs: no second repr)."""
    if isinstance(real, list | tuple):
        return (type(shown) is list and len(shown) == len(real)
                and all(_same(s, r) for s, r in zip(shown, real, strict=True)))
    if isinstance(real, Mapping):
        return (type(shown) is dict and len(shown) == len(real)
                and all(k in shown and _same(shown[k], v) for k, v in real.items()))
    return bool(shown == real) if type(shown) is type(real) else False


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


def worker_reprs(app: Celery, task: Task[Any, Any] | None, args: Any, kwargs: Any,
                 redact: Redactor) -> tuple[str, str]:
    """The ``argsrepr``/``kwargsrepr`` a worker shows of a message it received, made from
    its decoded ``args`` and ``kwargs`` (never from its headers, which the publisher
    chose), redacted and cut as Celery cuts its own."""
    amqp = app.amqp
    levels = app.conf.task_repr_maxlevels
    if isinstance(args, str) or not isinstance(args, Sequence):
        args = [args] if args is not None else []
    if not isinstance(kwargs, Mapping):
        kwargs = {"kwargs": kwargs} if kwargs is not None else {}
    shown_args, shown_kwargs = redact.arguments(
        args, kwargs, task_parameters(task),
        limit=2 * max(amqp.argsrepr_maxsize, amqp.kwargsrepr_maxsize))
    return (saferepr(shown_args, amqp.argsrepr_maxsize, maxlevels=levels),
            saferepr(shown_kwargs, amqp.kwargsrepr_maxsize, maxlevels=levels))


def celery_reprs(app: Celery, args: Any, kwargs: Any) -> dict[str, str]:
    """The ``argsrepr``/``kwargsrepr`` Celery would make of a publish's large arguments
    (the same text, see :mod:`jobbers_celery.core.reprcut`), made from the part its cut can
    show, to pass to ``send_task``: Celery's own walks every element. Empty for small
    arguments (Celery's is as cheap) and for what the copy cannot promise."""
    found: dict[str, str] = {}
    levels = app.conf.task_repr_maxlevels
    amqp = app.amqp
    for header, value, size in (("argsrepr", args, amqp.argsrepr_maxsize),
                                ("kwargsrepr", kwargs, amqp.kwargsrepr_maxsize)):
        if not reprcut.is_large(value):
            continue
        part = reprcut.shown_part(value, size, levels)
        if part is not None:
            found[header] = saferepr(part, size, maxlevels=levels)
    return found


def _is_celerys(given: str, real: Any, levels: int) -> bool:
    """Whether ``given`` is the repr Celery made of ``real`` (not one passed to
    ``apply_async``): compared on a short repr, as Celery's is costly on big values."""
    probe = saferepr(real, _PROBE, maxlevels=levels)
    if len(probe) < _PROBE - 8:  # the whole repr
        return given == probe
    return given.startswith(probe[:_PROBE // 2])


def redact_exception(exc: BaseException, task: Task[Any, Any] | None, args: Any, kwargs: Any,
                     redact: Redactor) -> None:
    """Redact, in place, ``exc`` and the exceptions it chains or groups: credentials and the
    secret values of the task's own arguments in their arguments, attributes and notes.
    Never raises."""
    try:
        known = redact.secrets(args if isinstance(args, Sequence) else (),
                               kwargs if isinstance(kwargs, Mapping) else {},
                               task_parameters(task))
        seen: set[int] = set()
        todo: deque[tuple[BaseException, int]] = deque([(exc, 0)])
        done = 0
        while todo:  # breadth-first: the ones a log line and a traceback show first
            current, depth = todo.popleft()
            if id(current) in seen:
                continue
            seen.add(id(current))
            if done < _MAX_EXCEPTIONS and depth < _MAX_GROUP_DEPTH:
                _redact_one(current, redact, known)
            else:  # past the limit: nothing of it shown, at no cost per character
                _blank(current)
            done += 1
            for chained in (current.__cause__, current.__context__):
                if chained is not None:
                    todo.append((chained, depth))
            members = getattr(current, "exceptions", None)
            if isinstance(current, BaseExceptionGroup) and isinstance(members, tuple):
                todo.extend((m, depth + 1) for m in members if isinstance(m, BaseException))
    except Exception:  # an odd exception: shown as it is rather than lost
        log.debug("could not redact the message of %r", type(exc), exc_info=True)


def _redact_one(exc: BaseException, redact: Redactor, known: frozenset[str]) -> None:
    """Each of ``exc``'s arguments, attributes and notes that shows a secret, redacted (the
    exception keeps its type and shape: a KeyError stays one, ``self.url`` stays a str)."""
    notes = getattr(exc, "__notes__", None)  # add_note(): printed with the traceback
    if isinstance(notes, list):
        exc.__notes__ = [redact.text(n, known) if isinstance(n, str) else n for n in notes]
    if not isinstance(exc, BaseExceptionGroup):  # a group's message is not in its args
        args = tuple(_redacted(a, redact, known) for a in exc.args)
        if args != exc.args:
            exc.args = args
    for name in _fields(exc):  # str() reads these, not args
        value = getattr(exc, name, None)
        if value is not None:
            shown = _redacted(value, redact, known)
            if shown is not value and shown != value:
                with contextlib.suppress(Exception):
                    setattr(exc, name, shown)
    attrs = getattr(exc, "__dict__", None)
    if isinstance(attrs, dict):
        for name, value in list(attrs.items()):
            if name.startswith("__") or isinstance(value, BaseException):
                continue
            shown = REDACTED if redact.is_secret_key(name) and value else _redacted(
                value, redact, known)
            if shown is not value and shown != value:
                with contextlib.suppress(Exception):  # a read-only property, a slot
                    setattr(exc, name, shown)
    for text in (_safe(str, exc), _safe(repr, exc)):
        text = text[:4096] if text is not None else None  # a group's repr holds its members'
        if text is not None and redact.text(text, known) != text:
            log.debug("%s keeps a secret in its own message text", type(exc).__name__)
            break


def _fields(exc: BaseException) -> tuple[str, ...]:
    """The C-level fields ``str()`` of ``exc`` shows (writable, and not in ``__dict__``)."""
    if isinstance(exc, OSError):
        return ("strerror", "filename", "filename2")
    if isinstance(exc, UnicodeError) and hasattr(exc, "reason"):
        return ("reason", "object")
    return ()


def _blank(exc: BaseException) -> None:
    """``exc``'s arguments, attributes, fields and notes replaced by :data:`PAST_LIMIT`
    (a group keeps its message, which cannot be set: its members are blanked)."""
    with contextlib.suppress(Exception):
        if not isinstance(exc, BaseExceptionGroup):
            exc.args = (PAST_LIMIT,)
        if isinstance(exc, OSError):
            exc.strerror, exc.filename, exc.filename2 = PAST_LIMIT, None, None
        elif isinstance(exc, UnicodeError) and hasattr(exc, "reason"):
            obj = getattr(exc, "object", "")
            setattr(exc, "object", b"" if isinstance(obj, bytes) else "")  # noqa: B010
            setattr(exc, "reason", PAST_LIMIT)  # noqa: B010
        if isinstance(getattr(exc, "__notes__", None), list):
            exc.__notes__ = [PAST_LIMIT]
        attrs = getattr(exc, "__dict__", None)
        for name, value in list(attrs.items()) if isinstance(attrs, dict) else ():
            if not name.startswith("__") and isinstance(value, str | bytes | Mapping | list
                                                        | tuple):
                with contextlib.suppress(Exception):
                    setattr(exc, name, PAST_LIMIT)


def _redacted(value: Any, redact: Redactor, known: frozenset[str]) -> Any:
    """``value`` (an exception's argument or attribute) redacted as it would be shown;
    ``value`` itself when nothing in it is secret or it is not plain data."""
    if isinstance(value, str):
        return redact.text(value, known)
    if isinstance(value, bytes):
        text = value.decode("utf-8", "replace")
        shown = redact.text(text, known)
        return value if shown == text else shown.encode("utf-8")
    if not isinstance(value, Mapping | list | tuple):
        return value
    shape = _shape(value, 0, set(), [_MAX_NODES])
    if shape == "refused":
        return REFUSED
    if shape == "plain":
        data = _known_out(redact.value(value), redact, known)
        if data == (list(value) if isinstance(value, list | tuple) else dict(value)):
            return value
        return tuple(data) if isinstance(value, tuple) else data
    return value


def _known_out(value: Any, redact: Redactor, known: frozenset[str]) -> Any:
    if not known:
        return value
    if isinstance(value, str):
        return redact.text(value, known)
    if isinstance(value, dict):
        return {k: _known_out(v, redact, known) for k, v in value.items()}
    if isinstance(value, list):
        return [_known_out(v, redact, known) for v in value]
    return value


def _shape(value: Any, depth: int, path: set[int], budget: list[int]) -> str:
    """``"plain"`` when ``value`` is small plain data (what an exception's argument or
    attribute may be redacted as), ``"object"`` when it holds an object (kept: shown by its
    own repr), ``"refused"`` when it is cyclic, nested too deep or too big (replaced)."""
    if value is None or isinstance(value, str | bytes | bool | int | float):
        return "plain"
    if not isinstance(value, Mapping | list | tuple):
        return "object"
    budget[0] -= 1
    if depth > 8 or id(value) in path or len(value) > 1000 or budget[0] < 0:
        return "refused"
    path.add(id(value))
    found = "plain"
    for item in value.values() if isinstance(value, Mapping) else value:
        one = _shape(item, depth + 1, path, budget)
        if one == "refused":
            return one
        if one == "object":
            found = one
    path.discard(id(value))
    return found


def _safe(render: Any, exc: BaseException) -> str | None:
    try:
        text = render(exc)
    except Exception:  # noqa: BLE001 - a __str__ or __repr__ that raises
        return None
    return text if isinstance(text, str) else None
