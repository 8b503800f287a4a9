"""One task's lifecycle as the admin shows it: its Redis record (redacted) and transitions,
with the gap between steps. Its own module because two pages show it: the live task page
(:mod:`~jobbers_django.admin.live`) and a dead-letter entry's detail page
(:mod:`~jobbers_django.admin.entries`). Redis unreachable is a message, never a 500."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jobbers_celery import TaskState
from jobbers_django import bridge
from jobbers_django.admin import charts
from jobbers_django.admin.base import STORE_ERRORS
from jobbers_django.admin.display import compact_json, duration
from jobbers_django.redaction import shown

__all__ = ["lifecycle"]


def lifecycle(task_id: str) -> dict[str, Any]:
    """The task's Redis record (progress redacted) and transitions, or why there are none."""
    try:
        detail = bridge.task_detail(task_id)
    except STORE_ERRORS as exc:
        return {"error": f"Redis is unreachable, so the lifecycle cannot be shown: {exc}"}
    record = shown(detail.record) if detail.record else None
    transitions = [shown(t) for t in detail.transitions]
    # the page's one date format may hide seconds: the gaps say how the steps followed
    steps = [{"t": t, "after": _gap(transitions[n - 1].at, t.at) if n else ""}
             for n, t in enumerate(transitions)]
    return {"record": record, "transitions": steps,
            "progress": compact_json(record.progress) if record else "",
            "progress_bar": charts.progress_bar(record.progress) if record else None,
            "unique": detail.unique,
            "cancellable": record is not None and record.state in (
                TaskState.SUBMITTED, TaskState.SCHEDULED, TaskState.STARTED)}


def _gap(before: datetime | None, after: datetime | None) -> str:
    """``+0.012 s``, ``+3.4 s``, ``+2m 05s`` between two transition times."""
    if before is None or after is None:
        return ""
    seconds = (after - before).total_seconds()
    if seconds < 60:
        return f"+{seconds:.3f} s" if seconds < 1 else f"+{seconds:.1f} s"
    return "+" + duration(after - before)
