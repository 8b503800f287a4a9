"""``manage.py jobbers_dlq``: the Django dead-letter queue from a shell, the same shape as
``celery jobbers dlq`` (the Redis sink's):

    jobbers_dlq list [--queue Q] [--task NAME] [--version N] [--group FINGERPRINT]
                     [--status S] [--limit N] [--json]
    jobbers_dlq show ID [--json]
    jobbers_dlq resubmit [ID ...] [--queue Q] [--task NAME] [--version N] [--group FP]
                         [--limit N]
                         [--dry-run] [--current-version] [--keep-retry-count]
                         [--rate PER_SECOND [--halt-after X --of-last N]] [--json]
    jobbers_dlq discard [ID ...] [--queue Q] [--task NAME] [--version N] [--group FP]
                        [--limit N] [--yes] [--json]
    jobbers_dlq run RUN_ID [--pause | --resume | --cancel | --continue] [--json]
    jobbers_dlq set-aside [--limit N] [--json]

Everything goes through :mod:`jobbers_django.dlq` and :mod:`jobbers_django.bridge`, as the
admin and the API do (audited, source ``code``), and is shown redacted as the API shows it
(``--json`` prints the API's answers). No ids and no filter is an error, never "everything".
Ids, filters, the rule that no criteria is refused, the exit codes and a run's columns are
jobbers_celery's dead-letter command-line model (``dlq_criteria``, ``DlqFilters``,
``DlqExit``, ``DlqRunView``), which ``celery jobbers dlq`` reads its input with too.
An id is any string Celery ran (at most 4,096 characters, text); every value a
publisher chose is printed through :func:`jobbers_celery.core.printable` (control characters,
newlines and bidi overrides shown escaped, never obeyed by the terminal).
Exit codes: 0 ok, 1 a runtime failure (Redis or the database unreachable), 2 bad input,
3 not found.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError
from django.utils.text import Truncator

from jobbers_celery import (
    ConfigurationError,
    DlqExit,
    DlqFilters,
    DlqRunView,
    DlqUsageError,
    StoreUnavailable,
    check_pace_options,
    check_task_id,
    dlq_criteria,
    fit_columns,
    human_time,
    iso_time,
    printable,
    terminal_width,
    unknown_task_message,
)
from jobbers_django import bridge, conf
from jobbers_django.api.serializers.responses import (
    DeadLetterEntrySerializer,
    FailureSerializer,
    ResubmitRunSerializer,
)
from jobbers_django.dlq import runs
from jobbers_django.dlq.actions import ActionResult, discard, resubmit
from jobbers_django.dlq.selection import Selection, SelectionError, filter_entries
from jobbers_django.models import (
    DeadLetterEntry,
    FailureGroup,
    ResubmitRun,
    Source,
    Status,
    VersionChoice,
)
from jobbers_django.redaction import arguments, text

OK, RUNTIME, USAGE, NOT_FOUND = DlqExit.OK, DlqExit.RUNTIME, DlqExit.USAGE, DlqExit.NOT_FOUND
LIST_LIMIT = 50


def _message(row: DeadLetterEntry) -> str:
    """The last failure, redacted as the API shows it (the entry's secret values too)."""
    message = text(row.exception_message, row.task_name, row.args, row.kwargs)
    return f"{row.exception_type}: {message}" if row.exception_type else message


def _when(value: datetime) -> str:
    """The one time format (``2026-11-27 21:33:05 UTC``), as the admin and
    ``celery jobbers`` write times."""
    return human_time(value)


def _json_value(value: Any) -> Any:
    """What JSON has no type for: a datetime in the one format of every JSON output
    (``2026-11-27T21:33:05.120Z``, as the REST API), anything else as text."""
    return iso_time(value) if isinstance(value, datetime) else str(value)


def _usage(message: str) -> CommandError:
    return CommandError(message, returncode=USAGE)


def _check_id(task_id: str) -> None:
    """Any string is an id (Celery runs any); only one no store can hold is refused."""
    try:
        check_task_id(task_id)
    except DlqUsageError as exc:
        raise _usage(exc.message) from None


def _filters(options: dict[str, Any]) -> DlqFilters:
    return DlqFilters(options.get("queue"), options.get("task"), options.get("version"))


def _entry_filters(filters: DlqFilters, group: str | None = None) -> dict[str, Any]:
    """The filters as :func:`jobbers_django.dlq.selection.filter_entries` names the fields
    (``--group``: the entries whose last failure is of that failure group)."""
    return {name: value for name, value in (("queue", filters.queue),
                                            ("task_name", filters.task),
                                            ("task_version", filters.version),
                                            ("fingerprint", group))
            if value is not None}


_FINGERPRINT = re.compile(r"[0-9a-f]{1,64}")


def _check_task(options: dict[str, Any]) -> None:
    """``--task``: a name no task has (not registered in the Celery app, no dead letter and
    no jobbers record of it) is bad input, exit 2 with the close matches, never an empty
    answer with exit 0 (a mistyped name)."""
    name: str | None = options.get("task")
    if name is None:
        return
    if DeadLetterEntry.objects.filter(task_name=name).exists():
        return  # the database alone answers most (no Celery app loaded for it)
    app = bridge.get_app()
    if name in app.tasks or bridge.get_jobbers().tasks(name=name, limit=1):
        return
    raise _usage(unknown_task_message(
        name, [n for n in app.tasks if not n.startswith("celery.")], "--task"))


def _group(options: dict[str, Any]) -> str | None:
    """``--group``: a failure group's fingerprint, as the API takes it (1 to 64 lowercase
    hex digits); one that is malformed or names no group is bad input (exit 2), never an
    empty selection that looks like success."""
    group: str | None = options.get("group")
    if group is None:
        return None
    if not _FINGERPRINT.fullmatch(group):
        raise _usage(f"--group: {printable(group[:80])!s} is not a fingerprint (1 to 64 "
                     "lowercase hex digits: the failure groups page shows them)")
    if not FailureGroup.objects.filter(fingerprint=group).exists():
        raise _usage(f"--group: no failure group {group} (see the admin's failure groups, "
                     "or GET dead-letter-queue/failure-groups)")
    return group


class Command(BaseCommand):
    help = ("The Django dead-letter queue: list, show, resubmit (paced with --rate), discard; "
            "and a paced resubmit's progress and controls (run).")

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

        def selection(p: CommandParser, limit_default: int | None) -> None:
            p.add_argument("--queue", help="exact queue name")
            p.add_argument("--task", help="exact task name")
            p.add_argument("--version", type=int, metavar="N", help="exact task version")
            p.add_argument("--group", metavar="FINGERPRINT",
                           help="one failure group: its fingerprint (the admin's failure "
                                "groups page, the API's fingerprint filter)")
            p.add_argument("--limit", type=int, default=limit_default, metavar="N",
                           help="at most this many entries, newest failure first "
                                f"(1 to {conf.MAX_LIMIT}; filters only)")
            p.add_argument("--json", action="store_true", help="JSON for scripts")

        p = sub.add_parser("list", help="dead-letter entries, newest failure first")
        selection(p, LIST_LIMIT)
        p.add_argument("--status", choices=[*Status.values, "all"], default=Status.DEAD,
                       help="entry status (default dead)")

        p = sub.add_parser("show", help="one entry and its failure history")
        p.add_argument("task_id", metavar="ID")
        p.add_argument("--json", action="store_true", help="JSON for scripts")

        p = sub.add_parser("resubmit", help="publish entries again (by ids or filters)")
        p.add_argument("task_ids", nargs="*", metavar="ID")
        selection(p, None)
        p.add_argument("--dry-run", action="store_true",
                       help="say what would be resubmitted; change nothing")
        p.add_argument("--current-version", action="store_true",
                       help="publish as the version registered now, not the entry's")
        p.add_argument("--keep-retry-count", action="store_true",
                       help="continue the retry count where it stopped (default: reset)")
        p.add_argument("--rate", type=float, metavar="PER_SECOND",
                       help="paced, in the background: at most this many per second")
        p.add_argument("--halt-after", type=int, metavar="X",
                       help="with --rate: halt when more than X of the last N failed again")
        p.add_argument("--of-last", type=int, metavar="N", help="the stop rule's window N")

        p = sub.add_parser("discard", help="mark entries discarded (kept, never published)")
        p.add_argument("task_ids", nargs="*", metavar="ID")
        selection(p, None)
        p.add_argument("--yes", action="store_true", help="do not ask for confirmation")

        p = sub.add_parser("set-aside", help="dead letters the sink refused for a reason of "
                           "their own, set aside so the rest were written")
        p.add_argument("--limit", type=int, default=LIST_LIMIT, metavar="N",
                       help=f"at most this many, newest first (1 to {conf.MAX_LIMIT})")
        p.add_argument("--json", action="store_true", help="JSON for scripts")

        p = sub.add_parser("run", help="a paced resubmit's progress; pause, resume, cancel")
        p.add_argument("run_id", type=int, metavar="RUN_ID")
        group = p.add_mutually_exclusive_group()
        for control in ("pause", "resume", "cancel"):
            group.add_argument(f"--{control}", action="store_true", help=f"{control} it")
        group.add_argument("--continue", dest="continue_", action="store_true",
                           help="a halted run goes on (its cause fixed); its stop rule "
                                "counts only what settles from now on")
        p.add_argument("--json", action="store_true", help="JSON for scripts")

    def handle(self, *args: Any, **options: Any) -> None:
        handler = getattr(self, f"do_{options['command'].replace('-', '_')}")
        try:
            handler(options)
        except (StoreUnavailable, ConfigurationError, DatabaseError) as exc:
            raise CommandError(f"{type(exc).__name__}: {exc}", returncode=RUNTIME) from exc

    # -------------------------------------------------------------- output
    def emit_json(self, value: Any) -> None:
        self.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=_json_value))

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]],
              optional: Sequence[str] = ()) -> None:
        """Aligned columns, each cell on one line (control characters escaped), fitted to
        the terminal's width as ``celery jobbers`` fits its tables (``fit_columns``)."""
        shown, cut, dropped = fit_columns(
            [str(c) for c in headers],
            [["-" if c in (None, "") else printable(str(c)) for c in r] for r in rows],
            terminal_width(), optional)
        cells = [shown, *cut]
        widths = [max(len(r[i]) for r in cells) for i in range(len(shown))]
        for row in cells:
            self.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
                              .rstrip())
        if dropped:
            self.stdout.write(f"(hidden at this width: {', '.join(dropped)}; --json has all)")

    def entries(self, rows: Sequence[DeadLetterEntry]) -> None:
        self.table(("TASK ID", "NAME", "VER", "QUEUE", "STATUS", "FAILURES", "LAST FAILED",
                    "EXCEPTION"),
                   [(r.task_id, r.task_name, r.task_version, r.queue, r.status,
                     r.failure_count, _when(r.last_failed_at),
                     Truncator(_message(r)).chars(60)) for r in rows],
                   optional=("FAILURES", "STATUS", "VER", "QUEUE", "LAST FAILED"))

    # -------------------------------------------------------------- selection
    def selection(self, options: dict[str, Any], limit_default: int) -> Selection:
        ids = tuple(options.get("task_ids") or ())
        given = _filters(options)
        group = _group(options)
        if group is not None and ids:
            raise _usage("--group is a filter: give ids or filters, not both")
        try:
            if group is None:
                dlq_criteria(ids, given, per_attempt=False)
        except DlqUsageError as exc:
            raise _usage(exc.message) from None
        filters = _entry_filters(given, group)
        limit = options.get("limit")
        if ids and limit is not None:
            raise _usage("--limit applies to filters only; ids select exactly the ids given")
        try:
            if ids:
                return Selection(task_ids=ids, limit=conf.MAX_IDS)
            return Selection(filters=filters,
                                      limit=limit if limit is not None else limit_default)
        except SelectionError as exc:
            raise _usage(DlqUsageError.of_field(exc.field, exc.message).message) from None

    # -------------------------------------------------------------- commands
    def do_list(self, options: dict[str, Any]) -> None:
        limit = options["limit"]
        if not 1 <= limit <= conf.MAX_LIMIT:
            raise _usage(f"--limit: must be between 1 and {conf.MAX_LIMIT}")
        _check_task(options)
        filters = _entry_filters(_filters(options), _group(options))
        if options["status"] != "all":
            filters["status"] = options["status"]
        qs = filter_entries(DeadLetterEntry.objects.defer("traceback"), filters)
        rows = list(qs.order_by("-last_failed_at", "-id")[: limit + 1])
        more, rows = len(rows) > limit, rows[:limit]
        if options["json"]:
            self.emit_json({"results": DeadLetterEntrySerializer(rows, many=True).data,
                            "more": more})
            return
        if not rows:
            self.stdout.write("No dead-letter entries match.")
            return
        self.entries(rows)
        self.stdout.write(f"{len(rows)} entr{'y' if len(rows) == 1 else 'ies'}"
                          + (f" (more match: --limit {limit})" if more else ""))

    def do_show(self, options: dict[str, Any]) -> None:
        task_id = options["task_id"]
        _check_id(task_id)
        entry = DeadLetterEntry.objects.filter(task_id=task_id).first()
        if entry is None:
            raise CommandError(f"task {printable(task_id)} is not in the dead-letter queue",
                               returncode=NOT_FOUND)
        failures = bridge.failure_history(task_id)
        if options["json"]:
            self.emit_json({
                "entry": DeadLetterEntrySerializer(entry).data,
                "failures": FailureSerializer(failures, many=True,
                                                context={"entry": entry}).data})
            return
        shown_args, shown_kwargs = arguments(entry.task_name, entry.args, entry.kwargs)
        lines = [
            ("task id", entry.task_id), ("name", entry.task_name),
            ("version", entry.task_version), ("queue", entry.queue or "-"),
            ("status", entry.status), ("reason", entry.reason),
            ("exception", entry.exception_type),
            ("message", text(entry.exception_message, entry.task_name, entry.args,
                             entry.kwargs)),
            ("failures", entry.failure_count),
            ("last failed", _when(entry.last_failed_at)),
            ("resubmitted", f"{entry.resubmit_count} time(s)"),
            ("args", json.dumps(shown_args, default=str)),
            ("kwargs", json.dumps(shown_kwargs, default=str)),
        ]
        width = max(len(k) for k, _ in lines)
        for key, value in lines:
            self.stdout.write(f"{key.ljust(width)}  {printable(str(value))}")
        self.stdout.write("")
        self.table(("ATTEMPT", "FAILED AT", "WORKER", "EXCEPTION"),
                   [(f.attempt, _when(f.failed_at), f.worker,
                     Truncator(f"{f.exception_type}: " + text(
                         f.exception_message, entry.task_name, entry.args, entry.kwargs))
                     .chars(70)) for f in failures])

    def do_resubmit(self, options: dict[str, Any]) -> None:
        selection = self.selection(options, conf.DEFAULT_RESUBMIT_LIMIT)
        version = VersionChoice.CURRENT if options["current_version"] else VersionChoice.ENTRY
        reset = not options["keep_retry_count"]
        rate, halt_after, of_last = options["rate"], options["halt_after"], options["of_last"]
        try:
            check_pace_options(rate, halt_after, of_last)
        except DlqUsageError as exc:
            raise _usage(exc.message) from None
        _check_task(options)
        try:
            pace = runs.Pace(rate, halt_after, of_last) if rate is not None else None
            if pace is not None and not options["dry_run"]:
                run = runs.start(selection, pace, reset_retry_count=reset, version=version,
                                 source=Source.CODE)
                self.show_run(run, options["json"], started=True)
                return
            result = resubmit(selection, reset_retry_count=reset, version=version,
                                       source=Source.CODE, dry_run=options["dry_run"])
        except SelectionError as exc:
            raise _usage(DlqUsageError.of_field(exc.field, exc.message).message) from None
        self.action_result(result, "resubmit", options["json"])

    def do_discard(self, options: dict[str, Any]) -> None:
        selection = self.selection(options, conf.DEFAULT_RESUBMIT_LIMIT)
        _check_task(options)
        if not options["yes"]:
            preview = discard(selection, dry_run=True)
            if not preview.matched:
                self.action_result(preview, "discard", options["json"])
                return
            if not sys.stdin.isatty():
                raise _usage(f"would discard {preview.matched} entries: confirm with --yes "
                             "(no terminal to ask)")
            answer = input(f"Discard {preview.matched} dead-letter entries? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                self.stdout.write("Nothing discarded.")
                return
        result = discard(selection, source=Source.CODE)
        self.action_result(result, "discard", options["json"])

    def do_run(self, options: dict[str, Any]) -> None:
        run_id = options["run_id"]
        if not ResubmitRun.objects.filter(pk=run_id).exists():
            raise CommandError(f"no paced resubmit {run_id}", returncode=NOT_FOUND)
        for control, move in (("pause", runs.pause), ("resume", runs.resume),
                              ("cancel", runs.cancel), ("continue_", runs.continue_run)):
            if options[control]:
                try:
                    move(run_id, source=Source.CODE)
                except runs.RunConflict as exc:
                    raise _usage(str(exc)) from None
        self.show_run(ResubmitRun.objects.get(pk=run_id), options["json"])

    def do_set_aside(self, options: dict[str, Any]) -> None:
        from jobbers_django.setaside import listing, shown_item

        limit = options["limit"]
        if not 1 <= limit <= conf.MAX_LIMIT:
            raise _usage(f"--limit: must be between 1 and {conf.MAX_LIMIT}")
        report = listing(limit)
        items = [shown_item(i) for i in report.entries]
        if options["json"]:
            self.emit_json({"kept": report.kept, "total": report.total, "results": items})
            return
        if items:
            self.table(("SET ASIDE AT", "TASK ID", "NAME", "ATTEMPT", "REASON", "WAITED IN",
                        "WHY"),
                       [(_when(i["at"]), i["task_id"] or "(unreadable)", i["name"],
                         i["attempt"], i["reason"], i["waited_in"],
                         Truncator(i["why"]).chars(80)) for i in items])
        self.stdout.write(f"{report.kept} set aside" + (
            f" ({report.total} in all: the oldest were dropped from the list)"
            if report.total > report.kept else "") + ".")

    # -------------------------------------------------------------- results
    def action_result(self, result: ActionResult, verb: str, as_json: bool) -> None:
        if as_json:
            data = {"dry_run": result.dry_run, "matched": result.matched, "more": result.more,
                    "skipped": result.skipped, "audit_id": result.audit_id,
                    "sample": DeadLetterEntrySerializer(result.sample, many=True).data,
                    "discarded" if verb == "discard" else "resubmitted": result.acted}
            if verb == "resubmit":
                data["published"] = [] if result.dry_run else result.published
            self.emit_json(data)
            return
        noun = "entry" if result.matched == 1 else "entries"
        if result.dry_run:
            self.stdout.write(f"Dry run: would {verb} {result.matched} dead-letter {noun}"
                              + (" (more match beyond --limit)" if result.more else "")
                              + "; nothing changed.")
            if result.sample:
                self.entries(result.sample)
        else:
            done = "resubmitted" if verb == "resubmit" else "discarded"
            line = f"{done.capitalize()} {len(result.acted)} dead-letter {noun}"
            if verb == "resubmit" and result.published is None:
                line += ": published once the enclosing transaction commits"
            elif verb == "resubmit":
                line += f": {len(result.published or [])} published"
            self.stdout.write(line + (f" (audit #{result.audit_id})." if result.audit_id
                                      else "."))
        for skipped in result.skipped:
            self.stdout.write(printable(f"skipped {skipped['task_id']}: {skipped['why']}"))

    def show_run(self, run: ResubmitRun, as_json: bool, started: bool = False) -> None:
        if as_json:
            self.emit_json(ResubmitRunSerializer(run).data)
            return
        view = DlqRunView(run)
        if started:
            self.stdout.write(view.started)
            self.stdout.write(f"Follow it: manage.py jobbers_dlq run {run.pk} (or the admin's "
                              "Paced resubmits page); it runs on the Celery workers.")
            return
        self.stdout.write(view.headline)
        self.table(view.COLUMNS, [view.row])
        if run.halt_reason:
            self.stdout.write(f"halted: {printable(run.halt_reason)}")
