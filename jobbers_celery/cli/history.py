"""``celery jobbers history``: throughput, failures, mean runtime and mean queue latency per
minute (or 5 min, 15 min, an hour) of one task name, one queue, or every task, over the
days jobbers keeps (``jobbers_history_days``).

The human form: the totals, then one row per bucket that saw work (``--all`` every bucket).
``--json`` prints the REST API's ``/history`` answer (every bucket, same keys). A range or
step jobbers refuses exits 2 with the reason.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import click
from celery.bin.base import CeleryOption

from jobbers_celery.cli import output as out
from jobbers_celery.cli.base import Command, env, json_option
from jobbers_celery.core.series import (
    MAX_NAME,
    STEPS,
    SeriesRangeError,
    parse_span,
    short_ms,
    total,
)

if TYPE_CHECKING:
    from jobbers_celery.core.series import SeriesPoint
    from jobbers_celery.telemetry.series import SeriesRead

__all__ = ["history"]


def _span(value: str, param: str) -> timedelta:
    try:
        return timedelta(milliseconds=parse_span(value))
    except SeriesRangeError as exc:
        raise click.BadParameter(str(exc), param_hint=param) from None


def _rate(point: SeriesPoint) -> str:
    rate = point.failure_rate
    return "-" if rate is None else f"{rate * 100:.1f}%"


def _human(read: SeriesRead, show_all: bool) -> str:
    what = (f"task {read.name}" if read.name is not None
            else f"queue {read.queue}" if read.queue is not None else "every task")
    whole = total(read.points)
    lines = [out.fields([
        ("History of", what), ("From", read.since), ("To", read.until),
        ("Step", f"{read.step_minutes} min"),
        ("Ended", f"{whole.throughput} ({whole.completed} completed, {whole.failed} failed, "
                  f"{_rate(whole)} failed)" if whole else None),
        ("Retried", whole.counts.retried if whole else None),
        ("Mean runtime", short_ms(whole.mean_runtime_ms) if whole else None),
        ("Mean queue latency", short_ms(whole.mean_latency_ms) if whole else None),
    ]), ""]
    rows = [(p.at, p.throughput, p.completed, p.failed, _rate(p), p.counts.retried,
             short_ms(p.mean_runtime_ms), short_ms(p.mean_latency_ms))
            for p in read.points
            if show_all or p.throughput or p.counts.started or p.counts.retried]
    lines.append(out.table(("AT", "ENDED", "COMPLETED", "FAILED", "FAILED %", "RETRIED",
                            "RUNTIME", "LATENCY"), rows, optional=("RETRIED", "COMPLETED")))
    if not show_all and len(rows) < len(read.points):
        lines.append(f"({len(read.points) - len(rows)} buckets without work not shown; "
                     "--all shows them)")
    return "\n".join(lines)


@click.command(cls=Command)
@click.option("--name", cls=CeleryOption, default=None, help="A task name.")
@click.option("--queue", cls=CeleryOption, default=None, help="A queue (routing key).")
@click.option("--since", cls=CeleryOption, default="1h", show_default=True,
              help="How far back the range starts: 90m, 24h, 7d.")
@click.option("--until", cls=CeleryOption, default=None,
              help="How far back the range ends: 30m, 2h (default: now).")
@click.option("--step", cls=CeleryOption, type=click.Choice([str(s) for s in STEPS]),
              default=None, help="Minutes per bucket (default: 1 up to 6 h, 5 up to 2 days, "
                                 "else 60).")
@click.option("--names", "list_names", cls=CeleryOption, is_flag=True,
              help="List the task names and queues the history holds since --since.")
@click.option("--all", "show_all", cls=CeleryOption, is_flag=True,
              help="Show every bucket, those without work too.")
@json_option
@click.pass_context
def history(ctx: click.Context, name: str | None, queue: str | None, since: str,
            until: str | None,
            step: str | None, list_names: bool, show_all: bool, as_json: bool) -> None:
    """Throughput, failures, runtime and queue latency over time, per task name or queue.

    Exit 2 for a range, step or name jobbers refuses.
    """
    if name is not None and queue is not None:
        raise click.UsageError("give --name or --queue, not both")
    for value, param in ((name, "'--name'"), (queue, "'--queue'")):
        if value is not None and (not value or len(value.encode()) > 4 * MAX_NAME):
            raise click.BadParameter("empty, or too long to be a task name or queue",
                                     param_hint=param)
    back = _span(since, "'--since'")
    end = _span(until, "'--until'") if until is not None else None
    e = env(ctx, as_json)
    if list_names:
        names, queues = e.jobbers.series_names(back.total_seconds() / 86400)
        if as_json:
            click.echo(out.to_json({"names": names, "queues": queues}))
        else:
            # fields() shows each value's control characters escaped
            click.echo(out.fields([("Task names", ", ".join(names) or None),
                                   ("Queues", ", ".join(queues) or None)]))
        return
    now = e.jobbers.now()
    try:
        read = e.jobbers.series(name=name, queue=queue, since=now - back,
                                until=now - end if end is not None else None,
                                step=int(step) if step else None)
    except SeriesRangeError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(out.to_json(read.as_dict()) if as_json else _human(read, show_all))
