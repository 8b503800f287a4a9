"""The part of a task's arguments that Celery's ``argsrepr`` can show.

Why: Celery makes every message's ``argsrepr``/``kwargsrepr`` with its ``saferepr`` cut at
``argsrepr_maxsize`` characters (1024), but after the cut it still walks every element left
in the containers it opened, to close their brackets: a ``starmap`` of 10,000 pairs, or an
import task given 100,000 row ids, spends more time in that walk than in the rest of its
publish. :func:`shown_part` copies only the elements the cut text can reach, so that
``saferepr`` of the copy, at the same ``maxlen`` and ``maxlevels``, is the same text as
``saferepr`` of the whole (the worker side and the ``task-sent`` event see no change);
jobbers passes that text to Celery as the ``argsrepr`` it would have made.

How it stays the same text: ``saferepr`` shows containers level by level in order and stops
at the first element met once ``maxlen`` characters are written; every element costs at
least one character (itself, the separator before it or its container's opening bracket),
so at most ``maxlen + 1`` elements are ever written. The copy keeps, in that order, the
first :func:`budget` elements expanded and two more per container as they are (never
expanded: the cut comes before them), so the token after the cut is the same (a separator,
then ``", ..."``) and every opened container is closed as before. Lists, tuples and dicts
of any subclass are written by ``saferepr`` as the plain type, so plain copies read the
same. Anything else (a set, a cycle, ``maxlevels`` of 0) is left to Celery: ``None``.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

__all__ = ["LARGE", "budget", "is_large", "shown_part"]

#: Elements a container must have before the copy is worth making (small arguments: Celery's
#: own walk is cheaper than a copy).
LARGE = 256
#: Elements kept past the budget in each container cut (see the module's docstring).
_EXTRA = 2


def budget(maxlen: int) -> int:
    """Elements a repr cut at ``maxlen`` characters can write, with a margin."""
    return maxlen + 4


def is_large(value: Any) -> bool:
    """Whether ``value`` (a message's ``args`` or ``kwargs``) or one of its items is a
    list, tuple or dict of more than :data:`LARGE` elements: a copy pays off."""
    if not isinstance(value, list | tuple | dict):
        return False
    if len(value) > LARGE:
        return True
    items = value.values() if isinstance(value, dict) else value
    return any(isinstance(v, list | tuple | dict) and len(v) > LARGE
               for v in islice(items, LARGE))


class _Refused(Exception):
    """Left to Celery: a cycle, or a container ``saferepr`` would not write as its plain
    type."""


def shown_part(value: Any, maxlen: int, maxlevels: int) -> Any | None:
    """A copy of ``value`` whose ``saferepr(copy, maxlen, maxlevels=maxlevels)`` equals
    ``saferepr(value, maxlen, maxlevels=maxlevels)``, holding at most about
    ``budget(maxlen)`` elements expanded; ``None`` when that cannot be promised."""
    if not isinstance(maxlen, int) or not isinstance(maxlevels, int) or maxlevels <= 0 \
            or maxlen <= 0:
        return None  # no cut (None: Celery's repr is whole) or no level limit: Celery's
    left = [budget(maxlen)]
    try:
        return _copy(value, 0, maxlevels, left, set())
    except (_Refused, RecursionError):
        return None


def _copy(value: Any, level: int, maxlevels: int, left: list[int], path: set[int]) -> Any:
    if isinstance(value, str | bytes | set | frozenset) or not isinstance(
            value, list | tuple | dict):
        return value  # written whole (or cut by saferepr itself) as it is
    if level >= maxlevels:
        return value  # written "[...]" without being looked into
    if id(value) in path:
        raise _Refused  # a cycle: saferepr marks it by the object's id
    path.add(id(value))
    try:
        if isinstance(value, dict):
            return dict(_cut(iter(value.items()), level, maxlevels, left, path,
                             pairs=True))
        kept = list(_cut(iter(value), level, maxlevels, left, path, pairs=False))
        return kept if isinstance(value, list) else tuple(kept)
    finally:
        path.discard(id(value))


def _cut(items: Iterator[Any], level: int, maxlevels: int, left: list[int],
         path: set[int], *, pairs: bool) -> Iterator[Any]:
    """The items of one container: expanded while the budget lasts, then ``_EXTRA`` more as
    they are. A dict's keys are never copied (``saferepr`` writes a key whole)."""
    for item in items:
        if left[0] <= 0:
            yield item
            yield from islice(items, _EXTRA - 1)
            return
        left[0] -= 1
        if pairs:
            yield item[0], _copy(item[1], level + 1, maxlevels, left, path)
        else:
            yield _copy(item, level + 1, maxlevels, left, path)
