"""``celery -A proj jobbers ...``: the operator's command line, a Celery sub-command.

Celery finds it through its own extension point for commands (the ``celery.commands`` entry
point of the installed ``jobbers`` package), so it loads the app the way every Celery command
does (``-A``, ``--broker``, ``--config``) and reads that app's jobbers store. Human tables by
default, ``--json`` for scripts; exit codes in :mod:`jobbers_celery.cli.base`.
"""

from __future__ import annotations

import logging
from typing import Any

import click
from celery.bin.base import CeleryOption

from jobbers_celery.cli import output as out
from jobbers_celery.cli.base import (
    Command,
    Env,
    Failure,
    NotFound,
    confirm,
    env,
    json_option,
)
from jobbers_celery.cli.dlq import dlq
from jobbers_celery.cli.fair import fair
from jobbers_celery.cli.history import history
from jobbers_celery.cli.names import check_task_name
from jobbers_celery.cli.periodic import periodic
from jobbers_celery.cli.ratelimits import rate_limits
from jobbers_celery.cli.search import find
from jobbers_celery.cli.workers import COMMANDS as FLEET_COMMANDS
from jobbers_celery.cli.workflow import workflow
from jobbers_celery.core.options import ResubmitVersion
from jobbers_celery.core.printable import printable
from jobbers_celery.core.states import TaskState
from jobbers_celery.core.unique import unique_json, unique_text

__all__ = ["jobbers"]

_LIMIT = click.IntRange(1, 10_000)


@click.group(name="jobbers")
@click.pass_context
def jobbers(ctx: click.Context) -> None:
    """Inspect and act on the tasks jobbers records (this app's store)."""
    if not logging.getLogger().handlers:
        # jobbers' own warnings (a skipped resubmit...) would repeat what the command
        # prints; its errors still show
        logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")


jobbers.add_command(dlq)
jobbers.add_command(fair)
jobbers.add_command(workflow)
jobbers.add_command(find)
for _command in FLEET_COMMANDS:  # workers, queues, pauses, pause, resume
    jobbers.add_command(_command)
jobbers.add_command(history)
jobbers.add_command(periodic)
jobbers.add_command(rate_limits)


def _emit(e: Env, data: Any, human: str) -> None:
    click.echo(out.to_json(data) if e.as_json else human)


# ------------------------------------------------------------------------------ status
@jobbers.command(cls=Command)
@json_option
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Counts per state, scheduled tasks, the cleaner's last pass, live workers."""
    e = env(ctx, as_json)
    j = e.jobbers
    counts = j.counts()
    nxt = j.scheduled(limit=1)
    cleaner = j.cleaner_status()
    workers = j.workers()
    data = {
        "counts": {s.value: counts.get(s, 0) for s in TaskState},
        "scheduled": counts.get(TaskState.SCHEDULED, 0),
        "next_run_at": out.iso(nxt[0].run_at) if nxt else None,
        "cleaner": out.cleaner_json(cleaner),
        "workers": [out.worker_json(w) for w in workers],
    }
    last = (f"{out.human_date(cleaner.last_run_at)} by {cleaner.by or '-'}"
            f" ({cleaner.last_duration_ms or 0:.1f} ms)" if cleaner.last_run_at else "never")
    human = "\n".join([
        out.table(("STATE", "TASKS"), [(s.value, counts.get(s, 0)) for s in TaskState]),
        "",
        out.fields([("Scheduled", counts.get(TaskState.SCHEDULED, 0)),
                    ("Next run at", nxt[0].run_at if nxt else None),
                    ("Cleaner last pass", last),
                    ("Cleaner overdue", "YES" if cleaner.overdue else "no"),
                    ("Live workers", len(workers))]),
        "",
        out.table(("WORKER", "PID", "LAST SEEN", "RUNNING"),
                  [(w.hostname, w.pid, w.last_seen_at, w.running) for w in workers]),
    ])
    _emit(e, data, human)


# ------------------------------------------------------------------------------ tasks
@jobbers.command(cls=Command)
@click.option("--state", cls=CeleryOption, help="Only tasks in this state.")
@click.option("--name", cls=CeleryOption, help="Only tasks of this name.")
@click.option("--queue", cls=CeleryOption, help="Only tasks routed to this queue.")
@click.option("--worker", cls=CeleryOption,
              help="Only tasks last run by this worker (its hostname, w1@host).")
@click.option("--limit", cls=CeleryOption, type=_LIMIT, default=50, show_default=True)
@json_option
@click.pass_context
def tasks(ctx: click.Context, state: str | None, name: str | None, queue: str | None,
          worker: str | None, limit: int, as_json: bool) -> None:
    """Tasks, newest first (errors and values redacted as in the admin)."""
    wanted = out.parse_state(state)
    e = env(ctx, as_json)
    found = e.jobbers.tasks(wanted, name, queue, limit, worker)
    if not found:  # a mistyped --name: exit 2, never "nothing matched"
        check_task_name(e, name)
    _emit(e, [out.record_json(r, e.redactor) for r in found], out.table(
        ("ID", "NAME", "STATE", "QUEUE", "ATTEMPT", "WORKER", "SUBMITTED", "ERROR"),
        [(r.task_id, r.name, r.state.value, r.queue, r.attempt, r.worker, r.submitted_at,
          out.error_text(r, e.redactor)) for r in found],
        optional=("WORKER", "ATTEMPT", "QUEUE", "SUBMITTED")))


@jobbers.command(cls=Command)
@click.argument("task_id", metavar="ID")
@json_option
@click.pass_context
def show(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """One task's record and its history (oldest first)."""
    out.parse_task_id(task_id)
    e = env(ctx, as_json)
    record = e.jobbers.get(task_id)
    if record is None:
        raise NotFound(f"no task {printable(task_id)} (unknown, or its record expired)")
    shown = out.record_json(record, e.redactor)
    steps = e.jobbers.history(task_id)
    lock = e.jobbers.unique_of(task_id)
    history = [out.transition_json(t, e.redactor) for t in steps]
    error = shown["error"]
    human = "\n".join([
        out.fields([
            ("ID", record.task_id), ("Name", record.name), ("Version", record.version),
            ("Queue", record.queue), ("State", record.state.value),
            ("Attempt", record.attempt), ("Retry attempt", record.retry_attempt),
            ("Worker", record.worker), ("Submitted", record.submitted_at),
            ("Started", record.started_at), ("Retried", record.retried_at),
            ("Completed", record.completed_at), ("Heartbeat", record.heartbeat_at),
            ("Run at", record.run_at),
            ("Error", f"{error['type']}: {error['message']}" if error else None),
            ("Progress", out.progress_text(shown["progress"])),
            ("Checkpoint", shown["checkpoint"]),
            ("Unique", unique_text(lock, task_id)),
        ], blocks=("Error",)),
        "",
        "History:",
        out.table(("AT", "FROM", "TO", "ATTEMPT", "WORKER", "REASON"),
                  [(t.at, t.from_state.value, t.to_state.value, t.attempt, t.worker,
                    h["reason"]) for t, h in zip(steps, history, strict=True)],
                  optional=("WORKER", "ATTEMPT")),
    ])
    _emit(e, {"task_id": task_id, "record": shown, "transitions": history,
              "unique": unique_json(lock, task_id)}, human)


@jobbers.command(cls=Command)
@click.option("--limit", cls=CeleryOption, type=_LIMIT, default=50, show_default=True)
@json_option
@click.pass_context
def scheduled(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Tasks waiting for a delayed retry, soonest first."""
    e = env(ctx, as_json)
    found = e.jobbers.scheduled(limit)
    _emit(e, [out.record_json(r, e.redactor) for r in found], out.table(
        ("ID", "NAME", "QUEUE", "ATTEMPT", "RETRY", "RUN AT", "ERROR"),
        [(r.task_id, r.name, r.queue, r.attempt, r.retry_attempt, r.run_at,
          out.error_text(r, e.redactor)) for r in found],
        optional=("RETRY", "ATTEMPT", "QUEUE")))


# ------------------------------------------------------------------------------ actions
@jobbers.command(cls=Command)
@click.argument("task_id", metavar="ID")
@click.option("--terminate", cls=CeleryOption, is_flag=True,
              help="Also interrupt it in its worker (prefork) after jobbers_cancel_grace.")
@json_option
@click.pass_context
def cancel(ctx: click.Context, task_id: str, terminate: bool, as_json: bool) -> None:
    """Cancel a task durably (it never runs again, whichever worker receives it)."""
    out.parse_task_id(task_id)
    e = env(ctx, as_json)
    before = e.jobbers.get(task_id)
    if before is None:
        raise NotFound(f"no task {printable(task_id)} (unknown, or its record expired)")
    if not e.jobbers.cancel(task_id, terminate=terminate):
        if as_json:  # the REST API's answer, then the error
            click.echo(out.to_json({"task_id": task_id, "cancelled": False,
                                    "outcome": "refused", "state": before.state.value,
                                    "terminate": terminate}))
        raise Failure(f"task {printable(task_id)} is {before.state.value}: nothing to cancel")
    after = e.jobbers.get(task_id)
    state = after.state.value if after else "gone"
    outcome = "cancelled" if state == "cancelled" else "requested"
    _emit(e, {"task_id": task_id, "cancelled": True, "outcome": outcome, "state": state,
              "terminate": terminate},
          f"{printable(task_id)}: "
          f"{'cancelled' if outcome == 'cancelled' else 'cancellation requested'}"
          f" (it was {before.state.value}, now {state})")


@jobbers.command(cls=Command)
@click.argument("task_ids", metavar="ID...", nargs=-1, required=True)
@click.option("--current-version", cls=CeleryOption, is_flag=True,
              help="Publish as the version the task has in this app, not the record's.")
@json_option
@click.pass_context
def resubmit(ctx: click.Context, task_ids: tuple[str, ...], current_version: bool,
             as_json: bool) -> None:
    """Send failed, stalled, dropped or cancelled tasks back to the broker (same ids).

    Exit 0 if every one was resubmitted, 3 if some are unknown, 1 if some could not be
    (running, completed, already resubmitted).
    """
    ids = list(dict.fromkeys(out.parse_task_id(t) for t in task_ids))
    e = env(ctx, as_json)
    version = ResubmitVersion.CURRENT if current_version else ResubmitVersion.ENTRY
    try:
        done = set(e.jobbers.resubmit(ids, version=version))
    except ValueError as exc:  # --current-version of a task this app does not register
        raise click.UsageError(printable(str(exc))) from exc
    skipped = [t for t in ids if t not in done]
    states = dict(zip(skipped, (r.state.value if r else None for r in
                                (e.jobbers.get(t) for t in skipped)), strict=True))
    why = {t: f"the task is {states[t]}" if states[t] else "unknown task" for t in skipped}
    _emit(e, {"resubmitted": [t for t in ids if t in done],
              "skipped": [{"task_id": t, "why": why[t]} for t in skipped]},
          out.table(("ID", "OUTCOME"), [(t, "resubmitted" if t in done else f"skipped: {why[t]}")
                                        for t in ids]))
    if any(states[t] is None for t in skipped):
        ctx.exit(3)
    if skipped:
        ctx.exit(1)


@jobbers.command(cls=Command)
@click.option("--name", cls=CeleryOption, help="Tasks of this name.")
@click.option("--queue", cls=CeleryOption, help="Tasks routed to this queue.")
@click.option("--submitted-before", cls=CeleryOption, metavar="WHEN",
              help="Submitted before this ISO-8601 time (UTC) or this long ago (7d, 12h).")
@click.option("--yes", "-y", cls=CeleryOption, is_flag=True, help="Do not ask to confirm.")
@json_option
@click.pass_context
def purge(ctx: click.Context, name: str | None, queue: str | None,
          submitted_before: str | None, yes: bool, as_json: bool) -> None:
    """Remove finished records and cancel waiting tasks matching ALL the criteria.

    Running tasks are left alone (cancel them). At least one criterion is required.
    """
    if name is None and queue is None and submitted_before is None:
        raise click.UsageError("purge needs at least one of --name, --queue, "
                               "--submitted-before (it never purges everything)")
    e = env(ctx, as_json)
    check_task_name(e, name)  # a mistyped --name would purge nothing, with exit 0
    before = out.parse_before(submitted_before, e.jobbers.now())
    criteria = {"name": name, "queue": queue, "submitted_before": out.iso(before)}
    click.echo("Purge the tasks matching all of:\n" + out.fields(
        [("  name", name or "(any)"), ("  queue", queue or "(any)"),
         ("  submitted before", before or "(any)")]), err=True)
    if not yes and not confirm(
            "Remove these finished records and cancel these waiting tasks?"):
        _emit(e, {"criteria": criteria, "purged": False}, "Nothing purged.")
        return
    report = e.jobbers.purge(name, queue, before)
    _emit(e, {"criteria": criteria, "purged": True, "removed": report.removed,
              "cancelled": report.cancelled, "skipped_running": report.skipped},
          out.fields([("Removed records", report.removed),
                      ("Cancelled tasks", len(report.cancelled)),
                      ("Left running", len(report.skipped))]))


@jobbers.command(cls=Command)
@json_option
@click.pass_context
def clean(ctx: click.Context, as_json: bool) -> None:
    """Run one cleaner pass now (what the jobbers.clean beat task does) and report it."""
    e = env(ctx, as_json)
    report = e.jobbers.clean()
    _emit(e, out.clean_json(report), out.fields([
        ("Pass at", report.at), ("By", report.by),
        ("Duration", f"{report.duration_ms:.1f} ms"), ("Examined", report.examined),
        ("Stalled", report.stalled), ("Recovered", len(report.recovered)),
        ("Dead-lettered", len(report.dead_lettered)), ("Kept", report.kept),
        *([("Recovered ids", " ".join(report.recovered[:20]))] if report.recovered else []),
        *([("Dead-lettered ids", " ".join(report.dead_lettered[:20]))]
          if report.dead_lettered else []),
    ]))
