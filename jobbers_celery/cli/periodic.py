"""``celery jobbers periodic``: each beat schedule jobbers watches, with its missed, late and
overlapping runs (``docs/howto/periodic.md``).

The human form: one row per schedule (name, task, schedule, last run, next slot, counts),
then ``--runs N`` recent runs of each. ``--json`` prints the REST API's ``periodic-tasks``
answer. ``--check`` exits 1 when a schedule has missed or late runs (for a monitor outside
jobbers, which still sees beat and the workers both down), naming them on stderr.
"""

from __future__ import annotations

import click
from celery.bin.base import CeleryOption

from jobbers_celery.cli import output as out
from jobbers_celery.cli.base import Command, Failure, env, json_option
from jobbers_celery.core.periodic import PeriodicSchedule, at

__all__ = ["periodic"]

_RUNS = click.IntRange(0, 1000)


def _row(s: PeriodicSchedule) -> list[object]:
    last = max((t for t in (s.last_started_at, s.last_published_at) if t), default=None)
    return [s.name, s.task, s.schedule, at(last),
            "removed" if s.removed_at else at(s.next_at), s.missed, s.late, s.overlapping,
            s.last_state]


def _runs(s: PeriodicSchedule) -> str:
    rows = [(r.state, at(r.slot_at), at(r.published_at), at(r.started_at), at(r.ended_at),
             " ".join(f for f, on in (("late", r.late), ("overlapping", r.overlapping)) if on))
            for r in s.runs]
    return out.table(("STATE", "SLOT", "PUBLISHED", "STARTED", "ENDED", "FLAGS"), rows,
                     optional=("PUBLISHED", "ENDED"))


@click.command(cls=Command)
@click.option("--runs", type=_RUNS, default=0, show_default=True, cls=CeleryOption,
              help="Recent runs of each schedule to list (--json: 10 unless set).")
@click.option("--check", is_flag=True, cls=CeleryOption,
              help="Exit 1 if a schedule has missed or late runs.")
@json_option
@click.pass_context
def periodic(ctx: click.Context, runs: int, check: bool, as_json: bool) -> None:
    """Beat schedules watched: last run, next slot, missed, late and overlapping runs."""
    e = env(ctx, as_json)
    source = ctx.get_parameter_source("runs")
    wanted = 10 if as_json and source is click.core.ParameterSource.DEFAULT else runs
    schedules = e.jobbers.periodic_tasks(runs=wanted)
    if as_json:
        click.echo(out.to_json({"count": len(schedules),
                                "results": [s.as_dict() for s in schedules]}))
    else:
        parts = [out.table(("SCHEDULE", "TASK", "EVERY", "LAST RUN", "NEXT", "MISSED", "LATE",
                            "OVERLAP", "LAST STATE"), [_row(s) for s in schedules],
                           optional=("EVERY", "LAST STATE", "TASK"))]
        if runs:
            for s in schedules:
                parts += ["", f"{out.cell(s.name)}:", _runs(s)]
        click.echo("\n".join(parts))
    if check:
        failing = [s for s in schedules if (s.missed or s.late) and not s.removed_at]
        if failing:
            names = ", ".join(out.cell(s.name) for s in failing[:20])
            raise Failure(f"{len(failing)} schedule(s) with missed or late runs: {names}")
