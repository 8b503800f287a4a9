"""``celery jobbers find --arg PATH=VALUE``: tasks by an argument's value (see
:meth:`Jobbers.search <jobbers_celery.Jobbers.search>` and ``docs/howto/search.md``).

Exit 0 with what was found (none is an answer too: the line under the table says how the
tasks were looked for), 2 for a malformed path or value or a path that reads a secret.
"""

from __future__ import annotations

import click
from celery.bin.base import CeleryOption

from jobbers_celery.cli import output as out
from jobbers_celery.cli.base import Command, env, json_option
from jobbers_celery.core.printable import printable

__all__ = ["find"]

_LIMIT = click.IntRange(1, 1000)


def _argument(value: str) -> tuple[str, str]:
    path, sep, wanted = value.partition("=")
    if not sep:
        raise click.UsageError("--arg is PATH=VALUE (order_id=42, 0=A-17, customer.id=9)")
    return path, wanted


@click.command(cls=Command)
@click.option("--arg", "argument", cls=CeleryOption, required=True, metavar="PATH=VALUE",
              help="The argument's path (a keyword name, a position 0, 1..., then keys: "
                   "order.id) and the value it holds.")
@click.option("--name", cls=CeleryOption, help="Only tasks of this name.")
@click.option("--limit", cls=CeleryOption, type=_LIMIT, default=50, show_default=True)
@json_option
@click.pass_context
def find(ctx: click.Context, argument: str, name: str | None, limit: int,
         as_json: bool) -> None:
    """Tasks whose argument holds a value, newest first: through the index where
    jobbers_indexed_arguments names the path, else among the newest
    jobbers_search_scan_limit records that still hold their arguments."""
    path, wanted = _argument(argument)
    e = env(ctx, as_json)
    # the app's tasks registered here (as Env.parameters reads them): a position is
    # searched by its task's parameters, so that a secret one is never
    e.jobbers.app.finalize()
    try:
        found = e.jobbers.search(path, wanted, name=name, limit=limit)
    except ValueError as exc:
        raise click.UsageError(printable(str(exc))) from exc
    if e.as_json:
        click.echo(out.to_json({
            "argument": found.path, "value": found.value, "name": found.name,
            "indexed": list(found.indexed), "examined": found.examined, "of": found.of,
            "more": found.more, "how": found.how,
            "results": [out.record_json(r, e.redactor) for r in found.tasks]}))
        return
    more = " (more match: raise --limit)" if found.more else ""
    click.echo("\n".join([
        out.table(("ID", "NAME", "STATE", "QUEUE", "ATTEMPT", "SUBMITTED", "ERROR"),
                  [(r.task_id, r.name, r.state.value, r.queue, r.attempt, r.submitted_at,
                    out.error_text(r, e.redactor)) for r in found.tasks]),
        "",
        printable(f"{len(found.tasks)} found{more}: {found.how}."),
    ]))
