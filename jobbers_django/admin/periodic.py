"""The periodic tasks page (``deadletterentry/live/periodic/``): each beat schedule jobbers
watches (``docs/howto/periodic.md``) with its task, schedule, last run, next slot and counts
of missed, late and overlapping runs, then each schedule's recent runs. Read through
:mod:`jobbers_django.bridge`; the read rule of the entries (live records are read under it);
Redis unreachable is a message on the page, never a 500. Names and descriptions come from
the beat schedule or django-celery-beat's table: the template escapes them, and control
characters are shown escaped."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from jobbers_celery import PeriodicRun, PeriodicSchedule, printable
from jobbers_django import bridge
from jobbers_django.admin.base import STORE_ERRORS, ReadOnlyAdmin

__all__ = ["RUNS_SHOWN", "PeriodicPagesAdmin"]

#: Recent runs shown per schedule.
RUNS_SHOWN = 10


def at(ms: int | None) -> datetime | None:
    """A time the watch keeps (ms of the Redis clock) as a UTC datetime."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def _run(run: PeriodicRun) -> dict[str, Any]:
    return {"state": printable(run.state), "slot": at(run.slot_at),
            "published": at(run.published_at), "started": at(run.started_at),
            "ended": at(run.ended_at), "late": run.late, "overlapping": run.overlapping,
            "id": printable(run.id) if not run.id.startswith("missed:") else ""}


def _schedule(s: PeriodicSchedule) -> dict[str, Any]:
    last = max((t for t in (s.last_started_at, s.last_published_at) if t), default=None)
    return {"name": printable(s.name), "task": printable(s.task),
            "schedule": printable(s.schedule), "source": s.source, "last_run": at(last),
            "next_at": at(s.next_at), "removed_at": at(s.removed_at),
            "last_state": printable(s.last_state or ""), "missed": s.missed, "late": s.late,
            "overlapping": s.overlapping, "runs_total": s.runs_total,
            "trouble": bool(s.missed or s.late or s.overlapping),
            "runs": [_run(r) for r in s.runs]}


class PeriodicPagesAdmin(ReadOnlyAdmin):
    """Adds the periodic tasks page to a model admin (the entries admin)."""

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [path("live/periodic/", wrap(self.periodic_view), name="jobbers_periodic"),
                *super().get_urls()]

    def periodic_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = self.admin_context(request, "Periodic tasks")
        try:
            jobbers = bridge.get_jobbers()
            schedules = jobbers.periodic_tasks(runs=RUNS_SHOWN)
            now = jobbers.now()  # the Redis clock's, as the times shown
        except STORE_ERRORS as exc:
            context["error"] = f"Redis is unreachable: {exc}"
            return TemplateResponse(request, "jobbers/admin/periodic.html", context)
        context.update(schedules=[_schedule(s) for s in schedules], now=now)
        return TemplateResponse(request, "jobbers/admin/periodic.html", context)
