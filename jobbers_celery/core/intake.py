"""What a worker takes of a message: the limits its publisher-chosen fields must keep.

A worker's main process hands each request to its pool; prefork pickles it (its headers,
``args`` and ``kwargs``), and a structure nested ~500 deep makes that pickling raise
``RecursionError`` in the main process: the worker dies, the message comes back and kills
the next one. A task id, a task name or a ``jobbers_*`` header value also becomes a key,
a record field or a history entry. So the worker checks them first (cheaply: lengths, and
one iterative walk that stops at the first limit passed) and ends a message over a limit
``dropped`` with the reason (see :mod:`jobbers_celery.worker.request`), never running it:

- :data:`MAX_DEPTH` levels of nesting in the arguments and headers;
- :data:`MAX_VALUES` values in them in all (a list of a million numbers is one level but a
  long walk and a long pickle);
- :data:`MAX_ID_CHARS` characters of task id, :data:`MAX_NAME_CHARS` of task name,
  :data:`MAX_HEADER_CHARS` of a ``jobbers_*`` header string.

No character is refused but a lone surrogate (a JSON ``"\\ud800"``), which has no UTF-8
form, so no key can hold it: any other id within the lengths runs and is recorded as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "MAX_HEADER_CHARS",
    "MAX_ID_CHARS",
    "MAX_NAME_CHARS",
    "MAX_VALUES",
    "identity_over_limits",
    "message_over_limits",
    "nesting_over_limits",
]

#: Levels of nesting of the arguments and headers a worker takes (pickle fails near 500;
#: the dead-letter table's JSON column near 950).
MAX_DEPTH = 100
#: Values (items of lists, tuples and dicts) a worker walks in one message.
MAX_VALUES = 1_000_000
#: Characters of a task id (Celery's own are 36; a key, an index member and a dead letter
#: are made of it).
MAX_ID_CHARS = 4096
#: Characters of a task name (a record field and the key of its name index).
MAX_NAME_CHARS = 1024
#: Characters of a ``jobbers_*`` header's string value (the worker reads and records them;
#: ``jobbers_epoch`` holds the task id that began its dataset).
MAX_HEADER_CHARS = MAX_ID_CHARS + 64

_CONTAINERS = (list, tuple, dict)


def identity_over_limits(task_id: Any, name: Any) -> str | None:
    """Why a task id and name cannot be recorded (too long, or holding a lone surrogate,
    which has no UTF-8 form: no key, no result backend can hold it), or ``None``."""
    if (type(task_id) is str and len(task_id) <= MAX_ID_CHARS and task_id.isascii()
            and (name is None or (type(name) is str and len(name) <= MAX_NAME_CHARS
                                  and name.isascii()))):
        return None  # the usual case (every publish asks), told without building anything
    for what, value, limit in (("task id", task_id, MAX_ID_CHARS),
                               ("task name", name, MAX_NAME_CHARS)):
        if not isinstance(value, str):
            continue
        if len(value) > limit:
            return f"its {what} has {len(value)} characters, over the limit of {limit}"
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return f"its {what} holds a lone surrogate (no UTF-8 form)"
    return None


def nesting_over_limits(values: Iterable[Any]) -> str | None:
    """Why ``values`` are too deep or too many to take, or ``None``: a walk level by level
    (no recursion), stopped at the first limit passed."""
    level = [v for v in values if isinstance(v, _CONTAINERS)]
    depth = count = 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            return f"its arguments or headers are nested deeper than {MAX_DEPTH} levels"
        below: list[Any] = []
        for value in level:
            items = value.values() if isinstance(value, dict) else value
            count += len(items)
            if count > MAX_VALUES:
                return f"its arguments or headers hold more than {MAX_VALUES:,} values"
            below += [v for v in items if isinstance(v, _CONTAINERS)]
        level = below
    return None


def message_over_limits(task_id: Any, name: Any, headers: Mapping[str, Any],
                        body: Any = None) -> str | None:
    """Why a message (its id, name, headers with ``args``/``kwargs``, and its body when it
    was decoded rather than kept as bytes) is over the intake limits, or ``None``."""
    why = identity_over_limits(task_id, name)
    if why:
        return why
    for key, value in headers.items():
        if (isinstance(key, str) and key.startswith("jobbers_") and isinstance(value, str)
                and len(value) > MAX_HEADER_CHARS):
            return (f"its {key} header has {len(value)} characters, over the limit of "
                    f"{MAX_HEADER_CHARS}")
    values = list(headers.values())
    if body is not None and not isinstance(body, bytes | str):
        values.append(body)
    return nesting_over_limits(values)
