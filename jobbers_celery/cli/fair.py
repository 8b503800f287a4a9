"""``celery jobbers fair``: what fair shares hold back (``concurrency_key`` tasks past their
key's cap), per task name and key: parked, on their way to start, running, and the cap.

A key is shown by the first 8 hex digits of its value's SHA-256 (as the history reasons
name it; ``--json`` adds the whole digest), never by the value. Exit 1 when the store
cannot be reached.
"""

from __future__ import annotations

from typing import Any

import click

from jobbers_celery.cli import output as out
from jobbers_celery.cli.base import Command, env, json_option
from jobbers_celery.core.fairshare import FairHeld

__all__ = ["fair", "fair_json"]


def fair_json(h: FairHeld) -> dict[str, Any]:
    """One key as ``--json`` (and the REST API) show it."""
    return {"name": h.name, "key": h.key, "digest": h.digest, "cap": h.cap,
            "parked": h.parked, "on_the_way": h.released, "running": h.running}


@click.command(cls=Command)
@json_option
@click.pass_context
def fair(ctx: click.Context, as_json: bool) -> None:
    """Tasks held back by fair shares, per task name and key (most parked first)."""
    e = env(ctx, as_json)
    held = e.jobbers.fair_held()
    click.echo(out.to_json([fair_json(h) for h in held]) if e.as_json else out.table(
        ("NAME", "KEY", "PARKED", "ON THEIR WAY", "RUNNING", "CAP"),
        [(h.name, h.key, h.parked, h.released, h.running, h.cap) for h in held]))
