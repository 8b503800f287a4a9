"""``--name``/``--task`` filters of ``celery jobbers``: a name no task has is bad input
(exit 2, the close matches named: :mod:`jobbers_celery.core.names`), never an empty answer
with exit 0. A name is known when the app registers it, or jobbers has a record of a task
of that name (one read of the name index, at most one entry per shard), or the caller's
``seen`` says so (the dead letters it found)."""

from __future__ import annotations

import click

from jobbers_celery.cli.base import Env
from jobbers_celery.core.names import unknown_task_message

__all__ = ["check_task_name", "registered_names"]


def registered_names(e: Env) -> list[str]:
    """The app's own task names (Celery's built-ins left out)."""
    return [n for n in e.jobbers.app.tasks if not n.startswith("celery.")]


def check_task_name(e: Env, name: str | None, option: str = "--name",
                    seen: bool = False) -> None:
    """Exit 2 when ``name`` is given and names no task this app or store knows."""
    if name is None or seen or name in e.jobbers.app.tasks:
        return
    if e.jobbers.tasks(name=name, limit=1):
        return
    raise click.UsageError(unknown_task_message(name, registered_names(e), option))
