"""How values look on the admin pages: redacted JSON, durations, times (the one format)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from jobbers_celery import human_time
from jobbers_django.redaction import display, redact

__all__ = ["breakable", "compact_json", "duration", "json_block", "local_time", "since"]


def breakable(name: str) -> str:
    """A dotted name that may wrap after its dots and underscores
    (``shop.<wbr>import_<wbr>catalog``) in a narrow column, never inside a word."""
    return format_html_join(mark_safe(".<wbr>"), "{}", (
        (format_html_join(mark_safe("_<wbr>"), "{}", ((p,) for p in part.split("_"))),)
        for part in name.split(".")))


def json_block(value: Any, *, redacted: bool = False, cut: bool | None = None) -> str:
    """A stored JSON value as people see it: redacted (unless ``redacted`` says it is
    already), long values cut (with a note); ``cut`` given: ``value`` is shown as it is
    (redacted and cut already), ``cut`` says whether it was cut."""
    shown, cut = (value, cut) if cut is not None else display(value, redacted=redacted)
    text = json.dumps(shown, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    if cut:
        return format_html("<pre class=\"jobbers-json\">{}</pre><p class=\"help\">Cut for "
                           "display (JOBBERS_DISPLAY_MAX_CHARS); resubmission uses the full "
                           "value.</p>", text)
    return format_html("<pre class=\"jobbers-json\">{}</pre>", text)


def compact_json(value: Any) -> str:
    """One line of redacted JSON (``""`` for ``None``)."""
    if value is None:
        return ""
    return json.dumps(redact(value), sort_keys=True, ensure_ascii=False, default=str)


def duration(delta: timedelta | None) -> str:
    """``1h 02m``, ``3m 05s``, ``12s`` (``""`` for ``None``)."""
    if delta is None:
        return ""
    seconds = max(0, int(delta.total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def local_time(value: datetime | None) -> str:
    """A time in the one format of every page, CLI and log: ``2026-11-27 21:33:05 UTC``
    (:func:`jobbers_celery.human_time`), its clock and zone kept on one line."""
    return human_time(value).replace(" UTC", "\u00a0UTC")


def since(now: datetime, then: datetime | None) -> timedelta | None:
    return now - then if then else None
