"""``celery jobbers dlq ...``: the Redis dead-letter sink (:class:`RedisDeadLetterSink`).

The same command shape as the Django sink's ``manage.py`` command: ``list``, ``show``,
``resubmit`` and ``discard``, by ids (``TASK_ID`` or ``TASK_ID:ATTEMPT``) or by filters
(``--queue``, ``--task``, ``--version``); no ids and no filter is a usage error, never
"everything". ``resubmit --rate R [--halt-after X --of-last N]`` starts a paced resubmit
that the workers' scheduler passes drive (:mod:`jobbers_celery.resubmit.pacer`), not this process;
``run ID [--pause|--resume|--cancel|--continue]`` shows and controls it.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from celery.bin.base import CeleryOption

from jobbers_celery.cli import output as out
from jobbers_celery.cli.aside import set_aside
from jobbers_celery.cli.base import Command, Env, NotFound, confirm, env, json_option
from jobbers_celery.cli.names import check_task_name
from jobbers_celery.core.errors import ResubmitRunConflict
from jobbers_celery.core.options import ResubmitVersion
from jobbers_celery.core.printable import printable
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.core.states import RESUBMITTABLE
from jobbers_celery.deadletter.redis_sink import RedisDeadLetterSink
from jobbers_celery.deadletter.selection import (
    DlqExit,
    DlqFilters,
    DlqRunView,
    DlqUsageError,
    check_pace_options,
    dlq_criteria,
)
from jobbers_celery.resubmit.pace import PaceError, ResubmitPace, ResubmitRunInfo

__all__ = ["dlq"]

_F = TypeVar("_F", bound=Callable[..., Any])
_LIMIT = click.IntRange(1, 10_000)
#: Entries a run skipped or could not publish that ``dlq run`` lists (``--json``: all).
_NOTES_SHOWN = 10


def _filters(func: _F) -> _F:
    for option in reversed((
            click.option("--queue", cls=CeleryOption, help="Entries of tasks routed here."),
            click.option("--task", "name", cls=CeleryOption, help="Entries of this task name."),
            click.option("--version", cls=CeleryOption, type=int,
                         help="Entries of this task version."))):
        func = option(func)
    return func


@click.group()
def dlq() -> None:
    """The dead-letter queue (Redis sink): list, show, resubmit, discard; set-aside (any
    sink)."""


dlq.add_command(set_aside)


def _sink(e: Env) -> RedisDeadLetterSink:
    sink = e.jobbers.sink
    if not isinstance(sink, RedisDeadLetterSink):
        kind = f"{type(sink).__module__}.{type(sink).__name__}"
        if type(sink).__module__.startswith("jobbers_django"):
            raise click.UsageError(
                f"this app's dead-letter sink is the Django sink ({kind}): its entries and "
                "paced resubmits are in the Django database; use `python manage.py "
                "jobbers_dlq` (list, show, resubmit, discard, run: the same shape) or the "
                "admin's Dead letters page")
        raise click.UsageError(
            f"this app's dead-letter sink is {kind}, not the Redis sink: manage its entries "
            "where it keeps them (the Django sink: `python manage.py jobbers_dlq`)")
    return sink


def _shown(e: Env, entries: Sequence[DeadLetter]) -> list[dict[str, Any]]:
    """Entries as shown, each with its task's state now (one round trip)."""
    states = e.jobbers.store.fields([x.recorded_task_id for x in entries], ("state",))
    return [out.dead_letter_json(e.jobbers.readable(x), e.redactor, e.parameters(x.name),
                                 row[0] or None)
            for x, row in zip(entries, states, strict=True)]


def _by_ids(e: Env, sink: RedisDeadLetterSink, ids: Sequence[str], every_attempt: bool
            ) -> list[DeadLetter]:
    """The entries the ids name (a task id: its newest attempt's entry, or all of them);
    exit 3, before anything changes, if one names none."""
    found: list[DeadLetter] = []
    missing: list[str] = []
    for given in ids:
        parsed = out.parse_dead_letter_id(given)
        if parsed.attempt is not None:
            exact = sink.entry(parsed.task_id, parsed.attempt)
            # else TASK_ID:N may be a task id with a colon in it
            entries = [exact] if exact else sink.of_task(given)
        else:
            entries = [] if every_attempt else _newest(e, sink, given)
            entries = entries or sink.of_task(given)
        if not entries:
            missing.append(given)
        found.extend(entries if every_attempt else entries[:1])
    if missing:
        raise NotFound(f"no dead-letter entry for {printable(', '.join(missing))}")
    return found


def _newest(e: Env, sink: RedisDeadLetterSink, task_id: str) -> list[DeadLetter]:
    """The entry of the task's current attempt, if it has one: then it is its newest (two
    ``HGET``s, where :meth:`~RedisDeadLetterSink.of_task` scans every entry)."""
    (attempt,) = e.jobbers.store.fields([task_id], ("attempt",))[0]
    entry = sink.entry(task_id, int(attempt)) if attempt and attempt.isdigit() else None
    return [entry] if entry else []


def _check(ids: Sequence[str], filters: DlqFilters) -> None:
    """Usage errors, before the store is read: malformed ids, no ids and no filter."""
    try:
        dlq_criteria(ids, filters, per_attempt=True)
    except DlqUsageError as exc:
        raise out.usage(exc) from None


def _select(e: Env, sink: RedisDeadLetterSink, ids: Sequence[str], filters: DlqFilters,
            limit: int, every_attempt: bool) -> list[DeadLetter]:
    found = (sink.select(filters.queue, filters.task, filters.version, limit) if not ids else
             [x for x in _by_ids(e, sink, ids, every_attempt) if filters.matches(x)])
    if not found:  # a mistyped --task: exit 2, never "nothing matched"
        check_task_name(e, filters.task, "--task")
    if every_attempt:
        return found
    # a task is resubmitted once, from its newest entry (the others would be skipped)
    newest: dict[str, DeadLetter] = {}
    for entry in found:
        kept = newest.get(entry.task_id)
        if kept is None or entry.attempt > kept.attempt:
            newest[entry.task_id] = entry
    return [x for x in found if newest[x.task_id] is x]


def _table(shown: Sequence[dict[str, Any]]) -> str:
    return out.table(out.DEAD_LETTER_HEADERS, [out.dead_letter_row(s) for s in shown],
                     optional=("TASK NOW", "VER", "REASON", "QUEUE", "FAILED AT"))


@dlq.command(name="list", cls=Command)
@_filters
@click.option("--limit", cls=CeleryOption, type=_LIMIT, default=50, show_default=True)
@json_option
@click.pass_context
def list_(ctx: click.Context, queue: str | None, name: str | None, version: int | None,
          limit: int, as_json: bool) -> None:
    """Entries, newest first (messages redacted)."""
    e = env(ctx, as_json)
    shown = _shown(e, _sink(e).select(queue, name, version, limit))
    if not shown:  # a mistyped --task: exit 2, never "nothing matched"
        check_task_name(e, name, "--task")
    click.echo(out.to_json(shown) if as_json else _table(shown))


@dlq.command(cls=Command)
@click.argument("entry_id", metavar="ID")
@json_option
@click.pass_context
def show(ctx: click.Context, entry_id: str, as_json: bool) -> None:
    """One entry (TASK_ID: its newest attempt's), arguments and traceback redacted."""
    out.parse_dead_letter_id(entry_id)
    e = env(ctx, as_json)
    shown = _shown(e, _by_ids(e, _sink(e), [entry_id], every_attempt=False))[0]
    if as_json:
        click.echo(out.to_json(shown))
        return
    click.echo(out.fields([
        ("ID", shown["id"]), ("Task", shown["name"]), ("Version", shown["version"]),
        ("Queue", shown["queue"]), ("Reason", shown["reason"]),
        ("Attempt", shown["attempt"]), ("Retry attempt", shown["retry_attempt"]),
        ("Worker", shown["worker"]), ("Failed at", out.human_iso(shown["failed_at"])),
        ("Task now", shown["task_state_now"] or "gone"),
        ("Args", shown["args"]), ("Kwargs", shown["kwargs"]),
        ("Checkpoint", shown["checkpoint"]),
        ("Unpublishable", shown["unpublishable"]),
        ("Exception", f"{shown['exception_type']}: {shown['exception_message'] or ''}"
         if shown["exception_type"] else shown["exception_message"]),
        ("Traceback", shown["traceback"]),
    ], blocks=("Exception", "Traceback")))


@dlq.command(cls=Command)
@click.argument("ids", metavar="[ID]...", nargs=-1)
@_filters
@click.option("--limit", cls=CeleryOption, type=_LIMIT, default=1000, show_default=True,
              help="At most this many entries (filters).")
@click.option("--dry-run", cls=CeleryOption, is_flag=True,
              help="Show what would be resubmitted; change nothing.")
@click.option("--current-version", cls=CeleryOption, is_flag=True,
              help="Publish as the version the task has in this app, not the entry's.")
@click.option("--rate", cls=CeleryOption, type=float, metavar="PER_SECOND",
              help="Paced: publish this many per second, in the background (the workers).")
@click.option("--halt-after", cls=CeleryOption, type=int, metavar="X",
              help="Paced: halt when more than X of the last N settled tasks failed again.")
@click.option("--of-last", cls=CeleryOption, type=int, metavar="N",
              help="Paced: the stop rule's window (with --halt-after).")
@json_option
@click.pass_context
def resubmit(ctx: click.Context, ids: tuple[str, ...], queue: str | None, name: str | None,
             version: int | None, limit: int, dry_run: bool, current_version: bool,
             rate: float | None, halt_after: int | None, of_last: int | None,
             as_json: bool) -> None:
    """Publish the entries' tasks again (same ids), from their entries' payloads; with
    --rate, paced, in the background (follow it with `dlq run ID`)."""
    pace = _pace(rate, halt_after, of_last)
    filters = DlqFilters(queue, name, version)
    _check(ids, filters)
    e = env(ctx, as_json)
    entries = _select(e, _sink(e), ids, filters, limit, every_attempt=False)
    shown = _shown(e, entries)
    if dry_run:
        if as_json:
            click.echo(out.to_json({"dry_run": True, "matched": len(shown),
                                    "entries": shown}))
        else:
            click.echo(_table(shown))
            click.echo(f"Dry run: would resubmit {len(entries)} entr"
                       f"{'y' if len(entries) == 1 else 'ies'}; nothing changed.")
        return
    version_of = ResubmitVersion.CURRENT if current_version else ResubmitVersion.ENTRY
    if pace is not None:
        selection: dict[str, Any] = ({"task_ids": list(ids)} if ids else {
            "filters": filters.given(), "limit": limit})
        # a run takes the entries whose tasks are dead now (an entry stays in the sink
        # after its task was resubmitted); the others would only count as skipped
        dead = {s["id"] for s in shown
                if s["task_state_now"] in (None, *RESUBMITTABLE) and not s["unpublishable"]}
        left_out = [s["id"] for s in shown if s["id"] not in dead]
        try:
            run = e.jobbers.start_resubmit_run(
                [x for x, s in zip(entries, shown, strict=True) if s["id"] in dead],
                pace.rate, pace.halt_after, pace.of_last, version=version_of,
                selection=selection, source="cli", username=_user())
        except ValueError as exc:  # --current-version of a task this app does not register
            raise click.UsageError(printable(str(exc))) from exc
        if as_json:
            click.echo(out.to_json({**run.to_json(), "left_out": left_out}))
            return
        root = ctx.find_root()
        app = root.params.get("app") or root.obj.app.main or "proj"  # what -A named
        click.echo(DlqRunView(run).started)
        click.echo(f"Follow it: celery -A {app} jobbers dlq run {run.id}; it runs on the "
                   "Celery workers (their scheduler passes).")
        if left_out:
            click.echo(f"Left out {len(left_out)} matching entr"
                       f"{'y' if len(left_out) == 1 else 'ies'} whose tasks are not dead now "
                       "(resubmitted, running or completed) or cannot be published.")
        return
    try:
        done = set(e.jobbers.resubmit_dead_letters(entries, version=version_of))
    except ValueError as exc:  # --current-version of a task this app does not register
        raise click.UsageError(printable(str(exc))) from exc
    why = {s["id"]: s["unpublishable"] or f"the task is {s['task_state_now'] or 'gone'}"
           for s in shown if s["task_id"] not in done}
    if as_json:
        click.echo(out.to_json({
            "dry_run": False, "matched": len(shown),
            "resubmitted": [s["task_id"] for s in shown if s["task_id"] in done],
            "skipped": [{"id": s["id"], "task_id": s["task_id"], "why": why[s["id"]]}
                        for s in shown if s["id"] in why]}))
    else:
        click.echo(out.table(("ID", "TASK", "OUTCOME"), [
            (s["id"], s["name"], f"skipped: {why[s['id']]}" if s["id"] in why
             else "resubmitted") for s in shown]))
        click.echo(f"Resubmitted {len(done)} of {len(entries)}.")
    if why:
        ctx.exit(DlqExit.RUNTIME)


@dlq.command(cls=Command)
@click.argument("ids", metavar="[ID]...", nargs=-1)
@_filters
@click.option("--limit", cls=CeleryOption, type=_LIMIT, default=1000, show_default=True,
              help="At most this many entries (filters).")
@click.option("--yes", "-y", cls=CeleryOption, is_flag=True, help="Do not ask to confirm.")
@json_option
@click.pass_context
def discard(ctx: click.Context, ids: tuple[str, ...], queue: str | None, name: str | None,
            version: int | None, limit: int, yes: bool, as_json: bool) -> None:
    """Remove entries for good (a TASK_ID: every entry of that task)."""
    filters = DlqFilters(queue, name, version)
    _check(ids, filters)
    e = env(ctx, as_json)
    sink = _sink(e)
    entries = _select(e, sink, ids, filters, limit, every_attempt=True)
    shown = _shown(e, entries)
    if not entries:
        click.echo(out.to_json({"discarded": 0, "ids": []}) if as_json
                   else "No matching entries.")
        return
    if not yes:
        click.echo(_table(shown[:10]), err=True)
        more = " (10 shown)" if len(shown) > 10 else ""
        if not confirm(f"Discard these {len(entries)} entries for good{more}?"):
            click.echo(out.to_json({"discarded": 0, "ids": []}) if as_json
                       else "Nothing discarded.")
            return
    removed = sink.discard(entries)
    e.jobbers.release_chord_parts(entries)  # a chord a discarded member held fails now
    click.echo(out.to_json({"discarded": removed, "ids": [s["id"] for s in shown]})
               if as_json else f"Discarded {removed} entr{'y' if removed == 1 else 'ies'}.")


@dlq.command(cls=Command)
@click.argument("run_id", metavar="ID", type=click.IntRange(min=1))
@click.option("--pause", "action", flag_value="pause", cls=CeleryOption,
              help="Publish nothing more until resumed (what was published is followed).")
@click.option("--resume", "action", flag_value="resume", cls=CeleryOption,
              help="Publish again, at the run's pace counted from now.")
@click.option("--cancel", "action", flag_value="cancel", cls=CeleryOption,
              help="Publish nothing more, for good (the rest stays dead).")
@click.option("--continue", "action", flag_value="continue", cls=CeleryOption,
              help="A halted run goes on (its cause fixed): its stop rule starts over.")
@json_option
@click.pass_context
def run(ctx: click.Context, run_id: int, action: str | None, as_json: bool) -> None:
    """A paced resubmit's progress; pause, resume, cancel or continue (halted) it."""
    e = env(ctx, as_json)
    _sink(e)  # the Django sink's runs are in its database (manage.py jobbers_dlq run)
    jobbers = e.jobbers
    info = jobbers.resubmit_run(run_id)
    if info is None:
        raise NotFound(f"no paced resubmit {run_id}")
    if action is not None:
        by = f"cli:{_user()}"
        try:
            info = {"pause": jobbers.pause_resubmit_run, "resume": jobbers.resume_resubmit_run,
                    "cancel": jobbers.cancel_resubmit_run,
                    "continue": jobbers.continue_resubmit_run}[action](run_id, by)
        except ResubmitRunConflict as exc:
            raise click.UsageError(printable(str(exc))) from exc
        except LookupError as exc:  # expired meanwhile
            raise NotFound(str(exc)) from exc
    click.echo(out.to_json(info.to_json()) if as_json else _run_text(info))


def _run_text(info: ResubmitRunInfo) -> str:
    """As ``manage.py jobbers_dlq run`` shows a Django sink's run."""
    view = DlqRunView(info)
    lines = [view.headline, out.table(view.COLUMNS, [view.row])]
    if info.publish_failed or info.ended_otherwise:
        lines.append(f"publish failed: {info.publish_failed}; ended otherwise (record gone): "
                     f"{info.ended_otherwise}")
    if info.halt_reason:
        lines.append(f"halted: {printable(info.halt_reason)}")
    for member, why in sorted(info.notes.items())[:_NOTES_SHOWN]:
        lines.append(printable(f"{member}: {why}"))
    if len(info.notes) > _NOTES_SHOWN:
        lines.append(f"... and {len(info.notes) - _NOTES_SHOWN} more (--json: all)")
    return "\n".join(lines)


def _pace(rate: float | None, halt_after: int | None, of_last: int | None
          ) -> ResubmitPace | None:
    """The pace the options give (usage errors naming the option), ``None`` if unpaced."""
    try:
        check_pace_options(rate, halt_after, of_last)
        return None if rate is None else ResubmitPace(rate, halt_after, of_last)
    except PaceError as exc:
        raise out.usage(DlqUsageError.of_field(exc.field, exc.message)) from None
    except DlqUsageError as exc:
        raise out.usage(exc) from None


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return ""
