"""``celery jobbers rate-limits``: the rate limits keyed by arguments (``rate_limit_by``),
each name's declared rate, the override in force and how many of its tasks wait on it; and
``set NAME RATE`` / ``clear NAME``, which every worker applies from its next start (no
restart; ``docs/howto/rate-limits.md``). ``set`` with a bad rate, an unknown name, or a
task without ``rate_limit_by`` (its override would never apply) exits 2; ``clear`` takes any
name."""

from __future__ import annotations

import click

from jobbers_celery.cli import output as out
from jobbers_celery.cli.base import Command, env, json_option
from jobbers_celery.cli.names import check_task_name
from jobbers_celery.core.ratelimit import RateLimitInfo

__all__ = ["rate_limits"]


def _show(infos: list[RateLimitInfo], as_json: bool) -> None:
    if as_json:
        click.echo(out.to_json({"count": len(infos), "results": [i.as_dict() for i in infos]}))
        return
    click.echo(out.table(("TASK", "DECLARED", "OVERRIDE", "IN FORCE", "KEY", "WAITING"),
                         [(i.name, i.declared, i.override, i.effective or ("unlimited" if i.declared else "not applied"), i.key,
                           i.held) for i in infos], optional=("KEY",)))


@click.group(name="rate-limits", cls=click.Group, invoke_without_command=True)
@json_option
@click.pass_context
def rate_limits(ctx: click.Context, as_json: bool) -> None:
    """Rate limits per key: declared, overridden, tasks waiting on them."""
    if ctx.invoked_subcommand is None:
        _show(env(ctx, as_json).jobbers.rate_limits(), as_json)


@rate_limits.command(name="set", cls=Command)
@click.argument("name")
@click.argument("rate")
@json_option
@click.pass_context
def set_(ctx: click.Context, name: str, rate: str, as_json: bool) -> None:
    """Override NAME's rate (like 10/s, 5/m, 100/h, 1000/d; or off) in every worker."""
    e = env(ctx, as_json)
    check_task_name(e, name, option="NAME")
    try:  # the refusal the admin and the REST API make: an override that would never apply
        e.jobbers.check_rate_limit_override(name, rate)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    try:
        e.jobbers.set_rate_limit(name, rate)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="RATE") from None
    _show([i for i in e.jobbers.rate_limits() if i.name == name], as_json)


@rate_limits.command(cls=Command)
@click.argument("name")
@json_option
@click.pass_context
def clear(ctx: click.Context, name: str, as_json: bool) -> None:
    """Drop NAME's override: its declared rate applies again."""
    e = env(ctx, as_json)
    try:
        e.jobbers.set_rate_limit(name, None)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    _show([i for i in e.jobbers.rate_limits() if i.name == name], as_json)
