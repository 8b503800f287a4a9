"""``{% load jobbers_text %}``: text a page shows as the command lines do.

- ``{{ value|printable }}`` shows a publisher-chosen id, name, queue or worker with its control
  characters escaped (:func:`jobbers_celery.core.printable`): in a page too, a newline would read
  as a space (``a\\nb`` like ``a b``) and a bidi override (U+202E) would reorder the text after
  it. HTML escaping still follows.
- ``{{ name|jobbers_name }}``: the same, allowed to wrap after its dots, ``_`` and ``@``.
- ``{{ at|jobbers_time }}``: the one time format, ``2026-11-27 21:33:05 UTC`` (always UTC, to
  the second, the zone written out: as the CLI, ``manage.py`` and the logs read; see
  :mod:`jobbers_celery.core.timefmt`); ``-`` for none.
- ``{{ at|jobbers_ago:now }}``: ``3 min ago`` / ``in 45 s`` from ``now`` (give the page's
  Redis-clock ``now`` where it has one; without it, this host's clock).
- ``{{ at|jobbers_iso }}``: ISO 8601 for a ``<time datetime>`` or a script (``""`` for none).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from django import template
from django.utils.html import conditional_escape
from django.utils.safestring import mark_safe

from jobbers_celery import human_time, iso_time, relative_time
from jobbers_celery import printable as _printable

__all__ = ["jobbers_ago", "jobbers_iso", "jobbers_name", "jobbers_time", "printable"]

register = template.Library()
_WRAP_AFTER = re.compile(r"([._@])(?=[^._@])")


@register.filter
def printable(value: Any) -> Any:
    return _printable(value) if isinstance(value, str) else value


#: A page keeps a time's clock and zone together (``08:57:47 UTC`` never split over two
#: lines in a narrow column; the date may go on the line above).
_NBSP = "\u00a0"


@register.filter
def jobbers_name(value: Any) -> Any:
    """A task, queue or worker name as :func:`printable` shows it, allowed to wrap after its
    dots, underscores and ``@`` (``shop.<wbr>rebuild_<wbr>search_<wbr>index``) in a narrow
    column, never inside a word."""
    if not isinstance(value, str):
        return value
    return mark_safe(_WRAP_AFTER.sub(r"\1<wbr>", conditional_escape(_printable(value))))


@register.filter
def jobbers_time(value: Any) -> str:
    """A datetime in the one format; anything else (``None``, ``""``) as ``-``."""
    if not isinstance(value, datetime):
        return "-"
    return human_time(value).replace(" UTC", _NBSP + "UTC")


@register.filter
def jobbers_ago(value: Any, now: Any = None) -> str:
    if not isinstance(value, datetime):
        return "-"
    text = relative_time(value, now if isinstance(now, datetime) else datetime.now(UTC))
    return text.replace(" s", _NBSP + "s").replace(" min", _NBSP + "min").replace(
        " h", _NBSP + "h").replace(" d", _NBSP + "d")


@register.filter
def jobbers_iso(value: Any) -> str:
    return (iso_time(value) or "") if isinstance(value, datetime) else ""
