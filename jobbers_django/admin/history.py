"""The history page (``deadletterentry/history/``): throughput with the failure rate beside
it, mean runtime and mean queue latency over the last hour, 24 hours or 7 days, for every
task, one task name (``?name=``) or one queue (``?queue=``), with the names and queues the
history holds as links. Drawn as inline SVG bar charts on the live page's chart styles (no
script); the points are :meth:`jobbers_celery.Jobbers.series`'s, read through
:mod:`jobbers_django.bridge` (one bounded read: at most 168 points, one ``HGETALL`` per
hour and shard). Needs the read permission of the entries; Redis unreachable is a message on
the page, never a 500."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from jobbers_celery import SeriesPoint, SeriesRangeError, TaskState, human_time, printable
from jobbers_celery import short_ms as short
from jobbers_django import bridge
from jobbers_django.admin import charts
from jobbers_django.admin.base import STORE_ERRORS, ReadOnlyAdmin

__all__ = ["RANGES", "HistoryAdminMixin", "bar_chart"]

#: The ranges the page offers: (query value, label, span).
RANGES: tuple[tuple[str, str, timedelta], ...] = (
    ("1h", "1 hour", timedelta(hours=1)),
    ("24h", "24 hours", timedelta(hours=24)),
    ("7d", "7 days", timedelta(days=7)),
)
#: The longest name or queue the page takes from its URL (the history keeps 200 bytes).
MAX_NAME_CHARS = 800
_DONE = charts.STATE_COLOURS[TaskState.COMPLETED]
_FAILED = charts.STATE_COLOURS[TaskState.FAILED]
_TIME = charts.STATE_COLOURS[TaskState.STARTED]
_WAIT = charts.STATE_COLOURS[TaskState.SUBMITTED]


def bar_chart(points: Sequence[SeriesPoint], parts: Sequence[tuple[str, str,
              Callable[[SeriesPoint], float | None]]], *, label: str,
              fmt: Callable[[float], str] = lambda v: f"{v:g}", width: int = 360,
              height: int = 120) -> SafeString:
    """One bar per point, its ``parts`` (``(name, colour, value of a point)``) stacked, on
    the scale of the largest stack; the peak on the y axis, the range's ends on the x axis,
    and each bar's values in its tooltip."""
    left, right, top, bottom = 46, 6, 8, 18
    plot_w, plot_h = width - left - right, height - top - bottom
    stacks = [[v or 0.0 for v in (fn(p) for _, _, fn in parts)] for p in points]
    peak = max((sum(s) for s in stacks), default=0.0)
    step = plot_w / max(1, len(points))
    bars: list[tuple[str, str, str, str, str, str]] = []
    for i, (point, stack) in enumerate(zip(points, stacks, strict=True)):
        y: float = top + plot_h
        tip = f"{human_time(point.at)}: " + ", ".join(
            f"{name} {fmt(v)}" for (name, _, _), v in zip(parts, stack, strict=True))
        for (_, colour, _), value in zip(parts, stack, strict=True):
            if value <= 0 or peak <= 0:
                continue
            h = max(1.0, plot_h * value / peak)
            y -= h
            bars.append((f"{left + i * step:.1f}", f"{y:.1f}", f"{max(0.6, step - 0.4):.1f}",
                         f"{h:.1f}", colour, tip))
    axes = format_html(
        '<line x1="{}" y1="{}" x2="{}" y2="{}" class="axis"/>'
        '<text x="{}" y="{}" text-anchor="end">{}</text>'
        '<text x="{}" y="{}" text-anchor="end">0</text>'
        '<text x="{}" y="{}">{}</text><text x="{}" y="{}" text-anchor="end">{}</text>',
        left, top + plot_h, left + plot_w, top + plot_h, left - 4, top + 9,
        fmt(peak) if peak else "-", left - 4, top + plot_h,
        left, height - 4, human_time(points[0].at)[5:16] if points else "",
        left + plot_w, height - 4, "now")
    legend = format_html_join("", '<li><span class="swatch" style="background:{}"></span>{}'
                              "</li>", ((colour, name) for name, colour, _ in parts))
    return format_html(
        '<svg class="jobbers-chart" viewBox="0 0 {} {}" role="img" aria-label="{}">{}{}'
        '</svg><ul class="jobbers-legend">{}</ul>', width, height, label, axes,
        format_html_join("", '<rect x="{}" y="{}" width="{}" height="{}" fill="{}">'
                         "<title>{}</title></rect>", bars), legend)


def _percent(v: float) -> str:
    return f"{v * 100:.1f}%"


def history_charts(points: Sequence[SeriesPoint]) -> SafeString:
    """The page's four charts, two to a row where they fit (the live page's layout)."""
    if not points:
        return mark_safe("")
    panels = (
        ("Throughput (tasks ended)", bar_chart(points, (
            ("completed", _DONE, lambda p: p.completed),
            ("failed", _FAILED, lambda p: p.failed)), label="Tasks ended per bucket")),
        ("Failure rate", bar_chart(points, (
            ("failed / ended", _FAILED, lambda p: p.failure_rate),),
            label="Share of the tasks ended that failed", fmt=_percent)),
        ("Mean runtime", bar_chart(points, (
            ("runtime", _TIME, lambda p: p.mean_runtime_ms),),
            label="Mean runtime of the attempts that ended", fmt=short)),
        ("Mean queue latency", bar_chart(points, (
            ("waited", _WAIT, lambda p: p.mean_latency_ms),),
            label="Mean time the attempts that started waited in their queue", fmt=short)),
    )
    return format_html('<div class="jobbers-charts">{}</div>', format_html_join(
        "", "<figure><figcaption>{}</figcaption>{}</figure>", panels))


class HistoryAdminMixin(ReadOnlyAdmin):
    """Adds the history page to a model admin (the entries admin)."""

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [path("history/", wrap(self.series_view), name="jobbers_history"),
                *super().get_urls()]

    def series_view(self, request: HttpRequest) -> HttpResponse:
        # not history_view: ModelAdmin's is an object's change history
        if not self.has_view_permission(request):
            raise PermissionDenied
        name, queue = request.GET.get("name") or None, request.GET.get("queue") or None
        chosen = request.GET.get("range", "24h")
        span = next((s for key, _, s in RANGES if key == chosen), None)
        what = (f"task {printable(name)}" if name is not None
                else f"queue {printable(queue)}" if queue is not None else "every task")
        base = reverse("admin:jobbers_history")
        context = self.admin_context(
            request, f"History of {what}", what=what, chosen=chosen,
            ranges=[(label, f"{base}?{urlencode(_query(name, queue, key))}", key == chosen)
                    for key, label, _ in RANGES])
        if span is None or (name is not None and queue is not None) or any(
                v is not None and len(v) > MAX_NAME_CHARS for v in (name, queue)):
            context["error"] = ("Choose a range of 1h, 24h or 7d, and a task name or a "
                                "queue (not both, each at most 800 characters).")
            return TemplateResponse(request, "jobbers/admin/history.html", context, status=400)
        try:
            read = bridge.series(name=name, queue=queue, span=span)
            names, queues = bridge.series_names(span.total_seconds() / 86400)
        except SeriesRangeError as exc:
            context["error"] = str(exc)
            return TemplateResponse(request, "jobbers/admin/history.html", context, status=400)
        except STORE_ERRORS as exc:
            context["error"] = f"Redis is unreachable: {exc}"
            return TemplateResponse(request, "jobbers/admin/history.html", context)
        ended = sum(p.throughput for p in read.points)
        failed = sum(p.failed for p in read.points)
        runtime = [(p.mean_runtime_ms or 0) * p.counts.ended for p in read.points]
        ran = sum(p.counts.ended for p in read.points)
        waited = sum(p.counts.latency_ms for p in read.points)
        started = sum(p.counts.started for p in read.points)
        context.update(
            chart=history_charts(read.points), step=read.step_minutes,
            since=read.since, until=read.until, ended=ended, failed=failed,
            failure_rate=_percent(failed / ended) if ended else "-",
            retried=sum(p.counts.retried for p in read.points),
            mean_runtime=short(sum(runtime) / ran) if ran else "-",
            mean_latency=short(waited / started) if started else "-",
            all_url=f"{base}?{urlencode(_query(None, None, chosen))}",
            names=[(printable(n), f"{base}?{urlencode(_query(n, None, chosen))}",
                    n == name) for n in names],
            queues=[(printable(q), f"{base}?{urlencode(_query(None, q, chosen))}",
                     q == queue) for q in queues],
        )
        return TemplateResponse(request, "jobbers/admin/history.html", context)


def _query(name: str | None, queue: str | None, chosen: str) -> dict[str, str]:
    query = {"range": chosen}
    if name is not None:
        query["name"] = name
    if queue is not None:
        query["queue"] = queue
    return query
