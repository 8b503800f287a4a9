"""``celery jobbers dlq set-aside``: the dead letters the sink refused for a reason of their
own (also in their storable form) or that could not be read back, set aside in a bounded
Redis list so the entries behind them were written (:mod:`jobbers_celery.deadletter.aside`). Whatever the
sink (Redis or Django): the list is in the jobbers Redis. Never their arguments."""

from __future__ import annotations

import click
from celery.bin.base import CeleryOption

from jobbers_celery.cli import output as out
from jobbers_celery.cli.base import Command, env, json_option

__all__ = ["set_aside"]

_HEADERS = ("SET ASIDE AT", "TASK ID", "TASK", "ATTEMPT", "REASON", "WAITED IN", "WHY")


@click.command(name="set-aside", cls=Command)
@click.option("--limit", cls=CeleryOption, type=click.IntRange(1, 1000), default=50,
              show_default=True)
@json_option
@click.pass_context
def set_aside(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Dead letters set aside (refused by the sink for a reason of their own), newest first."""
    report = env(ctx, as_json).jobbers.set_aside(limit)
    shown = [{"at": out.iso(i.at), "task_id": i.task_id, "name": i.name, "attempt": i.attempt,
              "reason": i.reason, "waited_in": i.source, "why": i.why} for i in report.entries]
    if as_json:
        click.echo(out.to_json({"kept": report.kept, "total": report.total, "results": shown}))
        return
    click.echo(out.table(_HEADERS, [
        (i.at, i.task_id or "(unreadable)", i.name, i.attempt, i.reason, i.source, i.why)
        for i in report.entries]))
    click.echo(f"{report.kept} set aside" + (
        f" ({report.total} in all: the oldest were dropped from the list)"
        if report.total > report.kept else "") + ".")
