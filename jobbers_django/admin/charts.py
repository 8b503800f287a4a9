"""The admin's pictures, drawn on the server as inline SVG (no script, no CDN, nothing to
load): a bar sparkline per failure group, the tasks per state over the last hour, and
progress bars.

The data comes from bounded sources: the groups' hourly counts from one aggregate query over
the groups of the page and the last 24 hours (:func:`hourly_failures`, index
``jobbers_failure_fp_at``), the per-state counts from the samples the workers keep in Redis
(:meth:`jobbers_celery.Jobbers.count_history`, at most one a minute).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count
from django.db.models.functions import TruncHour
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from jobbers_celery import CountSample, ProgressShown, TaskState, progress_shown
from jobbers_django.models import DeadLetterFailure
from jobbers_django.redaction import redact

__all__ = ["HOURS", "PANELS", "STATE_COLOURS", "hourly_failures", "progress", "progress_bar",
           "sparkline", "state_chart", "state_charts"]

#: Hours a group's sparkline covers (one bar each).
HOURS = 24
#: One colour per state, told apart without relying on red/green alone.
STATE_COLOURS: dict[TaskState, str] = {
    TaskState.UNSUBMITTED: "#9e9e9e", TaskState.SUBMITTED: "#1f77b4",
    TaskState.SCHEDULED: "#9467bd", TaskState.STARTED: "#ff7f0e",
    TaskState.COMPLETED: "#2ca02c", TaskState.FAILED: "#d62728",
    TaskState.CANCELLED: "#7f7f7f", TaskState.STALLED: "#8c564b",
    TaskState.DROPPED: "#e377c2",
}


def hourly_failures(fingerprints: Iterable[str], now: datetime,
                    hours: int = HOURS) -> dict[str, list[int]]:
    """Failures per hour of each group over the last ``hours`` (oldest first), from ONE
    query: ``GROUP BY fingerprint, hour`` over the failure rows of ``fingerprints`` newer
    than ``now - hours`` (an index-only range per fingerprint on ``jobbers_failure_fp_at``)."""
    fps = list(dict.fromkeys(fingerprints))
    if not fps:
        return {}
    end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    start = end - timedelta(hours=hours)
    out = {fp: [0] * hours for fp in fps}
    rows = (DeadLetterFailure.objects.order_by()
            .filter(fingerprint__in=fps, failed_at__gte=start, failed_at__lt=end)
            .annotate(hour=TruncHour("failed_at")).values_list("fingerprint", "hour")
            .annotate(n=Count("*")))  # not a column: the index alone answers
    for fp, hour, n in rows:
        slot = int((hour - start).total_seconds() // 3600)
        if 0 <= slot < hours:
            out[fp][slot] += n
    return out


def sparkline(values: Sequence[int], *, label: str, width: int = 120,
              height: int = 22) -> SafeString:
    """Bars, one per value, scaled to the largest (a flat baseline when all are zero)."""
    top = max(values, default=0)
    step = width / max(1, len(values))
    bars = []
    for i, v in enumerate(values):
        if not v:
            continue
        h = max(1.5, (height - 2) * v / top)
        bars.append((f"{i * step + 0.5:.1f}", f"{height - h:.1f}",
                     f"{max(1.0, step - 1):.1f}", f"{h:.1f}", v))
    return format_html(
        '<svg class="jobbers-spark" width="{}" height="{}" viewBox="0 0 {} {}" role="img" '
        'aria-label="{}"><title>{}</title><line x1="0" y1="{}" x2="{}" y2="{}" '
        'class="base"/>{}</svg>',
        width, height, width, height, label, label, height - 0.5, width, height - 0.5,
        format_html_join("", '<rect x="{}" y="{}" width="{}" height="{}"><title>{}</title>'
                         "</rect>", bars))


#: The live page's panels, each on its own scale (the completed tasks, thousands, would
#: flatten the few running or failing ones).
PANELS: tuple[tuple[str, tuple[TaskState, ...]], ...] = (
    ("Waiting and running", (TaskState.SUBMITTED, TaskState.SCHEDULED, TaskState.STARTED)),
    ("Completed", (TaskState.COMPLETED,)),
    ("Failed, stalled, dropped, cancelled", (TaskState.FAILED, TaskState.STALLED,
                                             TaskState.DROPPED, TaskState.CANCELLED)),
)


def state_charts(samples: Sequence[CountSample], now: datetime, *,
                 minutes: int = 60) -> SafeString:
    """The :data:`PANELS`, side by side (``""`` without samples: the page says why)."""
    if not samples:
        return mark_safe("")
    return format_html('<div class="jobbers-charts">{}</div>', format_html_join(
        "", '<figure><figcaption>{}</figcaption>{}</figure>',
        ((title, state_chart(samples, now, states, minutes=minutes))
         for title, states in PANELS)))


def state_chart(samples: Sequence[CountSample], now: datetime,
                states: Sequence[TaskState] = tuple(TaskState), *, minutes: int = 60,
                width: int = 360, height: int = 130) -> SafeString:
    """Tasks in ``states`` over the last ``minutes``: one line per state, x from ``now -
    minutes`` to ``now``, y from 0 to the largest count, with a legend of the last counts."""
    if not samples:
        return mark_safe("")
    left, right, top, bottom = 40, 8, 8, 20
    plot_w, plot_h = width - left - right, height - top - bottom
    start = now - timedelta(minutes=minutes)
    peak = max([x.counts.get(s, 0) for x in samples for s in states] or [0]) or 1

    def xy(sample: CountSample, state: TaskState) -> str:
        x = left + plot_w * max(0.0, (sample.at - start).total_seconds()) / (minutes * 60)
        y = top + plot_h * (1 - sample.counts.get(state, 0) / peak)
        return f"{min(x, left + plot_w):.1f},{y:.1f}"

    lines = format_html_join(
        "", '<polyline points="{}" stroke="{}" data-state="{}"><title>{}: {} now</title>'
        "</polyline>",
        ((" ".join(xy(x, s) for x in samples), STATE_COLOURS[s], s.value, s.value,
          samples[-1].counts.get(s, 0)) for s in states))
    axes = format_html(
        '<line x1="{}" y1="{}" x2="{}" y2="{}" class="axis"/>'
        '<text x="{}" y="{}" text-anchor="end">{}</text>'
        '<text x="{}" y="{}" text-anchor="end">0</text>'
        '<text x="{}" y="{}">-{} min</text><text x="{}" y="{}" text-anchor="end">now</text>',
        left, top + plot_h, left + plot_w, top + plot_h, left - 4, top + 10, peak,
        left - 4, top + plot_h, left, height - 4, minutes, left + plot_w, height - 4)
    legend = format_html_join(
        "", '<li><span class="swatch" style="background:{}"></span>{} {}</li>',
        ((STATE_COLOURS[s], s.value, samples[-1].counts.get(s, 0)) for s in states))
    return format_html(
        '<svg class="jobbers-chart" viewBox="0 0 {} {}" role="img" aria-label="Tasks per '
        'state over the last {} minutes">{}{}</svg><ul class="jobbers-legend">{}</ul>',
        width, height, minutes, axes, lines, legend)


def progress(value: Any) -> ProgressShown | None:
    """A reported progress as shown (:func:`jobbers_celery.progress_shown`: a bar for any
    ``{x, of|total}``, ``percent`` or ``fraction``; a bare number is a counter; anything else
    readable text), or ``None`` when there is none. Secret-looking keys redacted first, as
    everywhere a page shows a stored value."""
    return progress_shown(redact(value))


def progress_bar(value: Any) -> SafeString | None:
    """A bar with its label, or the label alone (no part of a whole to draw), or ``None``
    (no progress reported). The label never wraps inside a word (admin.css)."""
    found = progress(value)
    if found is None:
        return None
    if found.fraction is None:
        return format_html('<span class="jobbers-progress-label">{}</span>', found.label)
    return format_html('<span class="jobbers-progress-cell"><span class="jobbers-progress" '
                       'role="progressbar" aria-label="progress" aria-valuemin="0" '
                       'aria-valuemax="100" aria-valuenow="{}" aria-valuetext="{}"><span '
                       'style="width:{}%"></span></span> <span class="jobbers-progress-label">'
                       '{}</span></span>', found.percent, found.label,
                       f"{100 * found.fraction:.1f}", found.label)
