"""Task names a filter gives that name no task: the words both command lines say.

A mistyped name (``--name shop.improt_catalog``) matches nothing, and an empty answer with
exit 0 reads as "nothing there". So a filter naming a task that the app does not register
and jobbers has no record (nor dead letter) of is bad input: the command lines exit 2 with
this message, naming the close matches among the names they know (:mod:`difflib`). Bounded:
a name is compared by its first :data:`NAME_MAX` characters against at most
:data:`KNOWN_MAX` known names (a message's name is untrusted, and the comparison is
quadratic in its length). Pure: the standard library only.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from jobbers_celery.core.printable import printable

__all__ = ["KNOWN_MAX", "NAME_MAX", "close_names", "unknown_task_message"]

#: Characters of a given name compared, and known names compared against.
NAME_MAX = 200
KNOWN_MAX = 5000


def close_names(name: str, known: Iterable[str], most: int = 3) -> list[str]:
    """Up to ``most`` of ``known`` that look like ``name``, closest first."""
    pool = sorted({k[:NAME_MAX] for k in known if k})[:KNOWN_MAX]
    return difflib.get_close_matches(name[:NAME_MAX], pool, n=most, cutoff=0.6)


def unknown_task_message(name: str, known: Iterable[str], option: str = "--name") -> str:
    """``option``'s value names no task: the one line both command lines exit 2 with."""
    near = close_names(name, known)
    hint = (f"; did you mean {' or '.join(printable(n) for n in near)}?" if near
            else "; the app's task names: celery -A proj inspect registered")
    return (f"{option}: no task named {printable(name[:NAME_MAX])!s}: this app does not "
            f"register it and jobbers has no record of it{hint}")
