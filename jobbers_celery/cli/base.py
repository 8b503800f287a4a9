"""What every ``celery jobbers`` command shares: the app's Jobbers, the redactor, exit codes.

Exit codes: 0 ok, 1 a runtime failure (the store unreachable, jobbers not installed, an
action that did not apply), 2 bad input (click's usage errors: unknown state, malformed id,
no criteria), 3 not found.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

import click
from celery.bin.base import CeleryCommand, CeleryOption
from kombu.exceptions import OperationalError

from jobbers_celery.core.errors import StoreUnavailable
from jobbers_celery.core.redaction import Parameters, Redactor
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.store import StoreError
from jobbers_celery.worker.taskrepr import redactor_of, task_parameters

__all__ = ["EXIT_FAILURE", "EXIT_NOT_FOUND", "Command", "Env", "Failure", "NotFound",
           "confirm", "env", "json_option"]

EXIT_FAILURE = 1
EXIT_NOT_FOUND = 3

_F = TypeVar("_F", bound=Callable[..., Any])


class Failure(click.ClickException):
    """A runtime failure: exit 1."""

    exit_code = EXIT_FAILURE


class NotFound(click.ClickException):
    """What the command names does not exist: exit 3."""

    exit_code = EXIT_NOT_FOUND


class Command(CeleryCommand):
    """A Celery command whose store (and broker) failures end as one clear line and exit 1,
    not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (StoreUnavailable, StoreError) as exc:
            raise Failure(f"the jobbers store is unreachable: {type(exc).__name__}: {exc}"
                          ) from exc
        except OperationalError as exc:  # kombu's: publishing a cancel or a resubmit
            raise Failure(f"the broker is unreachable: {exc}") from exc


@dataclass
class Env:
    """The app the ``celery`` command found (``-A``, ``--broker``, config) and its Jobbers."""

    jobbers: Jobbers
    as_json: bool = False

    @cached_property
    def redactor(self) -> Redactor:
        return redactor_of(self.jobbers.config)

    def parameters(self, task_name: str | None) -> Parameters | None:
        """The positional parameter names of ``task_name`` in this app (to redact
        ``login('ann', 'hunter2')`` by name), ``None`` if the app does not have it."""
        return task_parameters(self.jobbers.app.tasks.get(task_name)) if task_name else None


def env(ctx: click.Context, as_json: bool = False) -> Env:
    """The jobbers of the app ``celery -A`` loaded (exit 1 if none is installed on it)."""
    app = ctx.find_root().obj.app
    # as `celery shell` does: Django set up (its fixup), the task modules imported, so the
    # tasks' parameter names (redaction) and versions (--current-version) are known here
    app.loader.import_default_modules()
    jobbers = Jobbers.find(app)
    if jobbers is None:
        raise Failure(f"jobbers is not installed on the Celery app {app.main!r}: call "
                      "jobbers_celery.install(app) in the module that -A names")
    return Env(jobbers, as_json)


def confirm(question: str) -> bool:
    """Ask on stderr (``--json`` output stays clean); no answer (no terminal, end of
    input) is no."""
    try:
        return click.confirm(question, err=True)
    except click.Abort:
        click.echo(err=True)
        return False


def json_option(func: _F) -> _F:
    return click.option("--json", "as_json", is_flag=True, cls=CeleryOption,
                        help="Print JSON for scripts (stable keys, ISO-8601 UTC dates).")(func)
