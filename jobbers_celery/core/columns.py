"""Tables that fit the terminal: both command lines (``celery jobbers`` and ``manage.py
jobbers_dlq``) lay out their columns here, so a table at ``COLUMNS=80`` is 80 wide.

Each column is shrunk by its kind, chosen from its header: free text (an error, a reason)
is cut at its end first; names (a task, a queue, a worker) lose their middle
(``shop.imp...catalog``), so both the package and the function stay readable; ids lose their
middle last, and are cut no shorter than :data:`ID_MIN` (a marker, ``...``, shows where), and
times and short columns are never cut. When even that does not fit, the optional columns
are left out, in the order given, and a line says which (``--json`` has everything).

The width is the terminal's (:func:`terminal_width`: ``COLUMNS`` if set, else its size);
output to a pipe or a file is never cut, whatever ``COLUMNS`` says (a script reading a table
gets whole values; pytest-xdist's workers, for one, export ``COLUMNS=80``). Pure: the
standard library only.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from enum import Enum

__all__ = ["ELIDED", "ID_MIN", "Kind", "column_kind", "elide", "fit_columns",
           "stdout_is_terminal", "terminal_width"]

#: What stands for the characters a cell lost.
ELIDED = "..."
#: Narrowest an id column is cut to (``3f2a1b...9c0d``), a name column, a text column.
ID_MIN = 13
NAME_MIN = 10
TEXT_MIN = 8
#: A column this narrow or narrower is never cut (a state, an attempt, a version).
SHORT = 10
#: Two spaces between columns.
GAP = 2


class Kind(Enum):
    """How a column gives up width, most willingly first."""

    TEXT = "text"  # cut at the end
    NAME = "name"  # elided in the middle
    ID = "id"  # elided in the middle, last
    KEEP = "keep"  # never cut (times, short columns)


_IDS = {"ID", "TASK ID", "RUN", "RUN ID", "WORKFLOW", "INCARNATION"}
_NAMES = {"NAME", "TASK", "QUEUE", "WORKER", "HOSTNAME", "GROUP", "ROOT", "BY", "USER"}
_TIMES = ("AT", "SUBMITTED", "STARTED", "COMPLETED", "LAST SEEN", "LAST FAILED", "RUN AT",
          "FAILED AT", "SET ASIDE AT", "CREATED", "FINISHED", "NEXT", "SINCE", "UNTIL")


def column_kind(header: str) -> Kind:
    """The kind of a column, by its header (the tables' own words)."""
    upper = header.upper()
    if upper in _IDS or upper.endswith(" ID"):
        return Kind.ID
    if upper in _NAMES:
        return Kind.NAME
    if upper in _TIMES or upper.endswith((" AT", "ED")):
        return Kind.KEEP
    return Kind.TEXT


def stdout_is_terminal() -> bool:
    """Whether stdout is a terminal (a replaced or closed stdout is not)."""
    try:
        return bool(sys.stdout.isatty())
    except (AttributeError, ValueError):
        return False


def terminal_width() -> int | None:
    """The width to fit when stdout is a terminal: ``COLUMNS`` if set, else the terminal's
    size; ``None`` (do not cut) when stdout is a pipe or a file."""
    if not stdout_is_terminal():
        return None
    columns = os.environ.get("COLUMNS", "")
    if columns.strip().isdigit() and int(columns) > 0:
        return int(columns)
    return shutil.get_terminal_size().columns


def elide(text: str, width: int, kind: Kind) -> str:
    """``text`` in at most ``width`` characters: text cut at its end, names and ids
    elided in the middle, :data:`ELIDED` marking the cut."""
    if len(text) <= width:
        return text
    if width <= len(ELIDED):
        return text[:width]
    room = width - len(ELIDED)
    if kind is Kind.TEXT or kind is Kind.KEEP:
        return text[:room] + ELIDED
    head = (room + 1) // 2
    return text[:head] + ELIDED + text[len(text) - (room - head):]


#: Narrowest a column is cut to while optional columns are left out instead: ids whole,
#: names and text still readable.
_COMFORT = {Kind.NAME: 20, Kind.TEXT: 16}


def _floor(kind: Kind, header: str, natural: int, comfortable: bool) -> int:
    if kind is Kind.KEEP or natural <= SHORT or (comfortable and kind is Kind.ID):
        return natural
    least = (_COMFORT if comfortable else
             {Kind.ID: ID_MIN, Kind.NAME: NAME_MIN, Kind.TEXT: TEXT_MIN})[kind]
    return min(natural, max(len(header), least))


def fit_columns(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int | None,
                optional: Sequence[str] = ()) -> tuple[list[str], list[list[str]], list[str]]:
    """The table (``headers`` and one-line ``rows``) fitted to ``width`` characters:
    the headers and rows kept, each cell elided to its column's width, and the headers
    left out (of ``optional``, in that order) because even their narrowest did not fit.
    ``width`` ``None``: nothing cut."""
    keep = list(range(len(headers)))
    natural = [max(len(headers[n]), *(len(r[n]) for r in rows)) if rows else len(headers[n])
               for n in keep]
    dropped: list[str] = []
    widths = list(natural)
    if width is not None:
        kinds = [column_kind(h) for h in headers]
        comfort, least = ([_floor(kinds[n], headers[n], natural[n], at_ease)
                           for n in range(len(headers))] for at_ease in (True, False))
        spare = [h for h in optional if h in headers]

        def fit(hard: bool) -> list[int] | None:
            return _shrink([natural[n] for n in keep], [comfort[n] for n in keep],
                           [least[n] for n in keep] if hard else None,
                           [kinds[n] for n in keep], width - GAP * (len(keep) - 1))

        # leave optional columns out rather than cut the rest below comfort; with none
        # left to leave out, cut down to the least
        fitted = fit(hard=False)
        while fitted is None and spare:
            gone = spare.pop(0)
            dropped.append(gone)
            keep.remove(headers.index(gone))
            fitted = fit(hard=False)
        if fitted is None:
            fitted = fit(hard=True)
        # as narrow as it goes: wider than asked
        widths = fitted if fitted is not None else [least[n] for n in keep]
    shown = [headers[n] for n in keep]
    kinds_kept = [column_kind(h) for h in shown]
    cut = [[elide(row[n], w, k) for n, w, k in zip(keep, widths, kinds_kept, strict=True)]
           for row in rows]
    return [elide(h, w, Kind.TEXT) for h, w in zip(shown, widths, strict=True)], cut, dropped


def _shrink(natural: list[int], comfort: list[int], least: list[int] | None,
            kinds: list[Kind], room: int) -> list[int] | None:
    """Column widths that sum to at most ``room``, ``None`` if they cannot. Text gives up
    width first, then names, each down to its comfortable floor; then (``least`` given)
    text, names and last ids down to their least. In each stage the widest column gives
    first, so cuts come out even."""
    widths = list(natural)
    excess = sum(widths) - room
    stages = [(Kind.TEXT, comfort), (Kind.NAME, comfort)]
    if least is not None:
        stages += [(Kind.TEXT, least), (Kind.NAME, least), (Kind.ID, least)]
    for kind, floors in stages:
        while excess > 0:
            slack = sorted(((widths[n], n) for n in range(len(widths))
                            if kinds[n] is kind and widths[n] > floors[n]), reverse=True)
            if not slack:
                break
            top, n = slack[0]
            nxt = slack[1][0] if len(slack) > 1 else floors[n]
            step = max(1, min(excess, top - max(nxt, floors[n])))
            widths[n] -= step
            excess -= step
    return widths if excess <= 0 else None
