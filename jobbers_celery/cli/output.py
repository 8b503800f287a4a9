"""What the ``celery jobbers`` command prints, and how it reads its arguments. No network.

Two forms of every answer: a human one (aligned tables, every date as
``2026-11-26 15:47:32 UTC``) and ``--json`` for scripts (stable keys, dates as
``2026-11-26T15:47:32.120Z``): the one time format (:mod:`jobbers_celery.core.timefmt`).
Both show values as the admin does: redacted by :class:`~jobbers_celery.Redactor`
(arguments by key and parameter name, credentials by look, messages and tracebacks).

Whoever publishes a message chooses its id, name, queue and much of its error message: the
human form shows every such value through :func:`~jobbers_celery.core.printable` (a terminal
escape, a carriage return or a bidi override is shown escaped, never obeyed; a newline too,
except inside a traceback's block), and ``--json`` escapes the characters JSON leaves raw
(C1 controls, bidi overrides, lone surrogates), so neither form can drive the terminal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from jobbers_celery.core.columns import fit_columns, terminal_width
from jobbers_celery.core.printable import printable, unprintable
from jobbers_celery.core.progress import progress_shown
from jobbers_celery.core.records import DeadLetter, TaskRecord, Transition, WorkerInfo
from jobbers_celery.core.redaction import Parameters, Redactor
from jobbers_celery.core.states import TaskState
from jobbers_celery.core.timefmt import human_time, iso_time
from jobbers_celery.deadletter.selection import (
    TASK_ID_MAX,
    DlqIdError,
    DlqUsageError,
    check_task_id,
)
from jobbers_celery.deadletter.selection import DlqId as DeadLetterId
from jobbers_celery.lifecycle.cleaner import CleanerStatus, CleanReport

__all__ = [
    "TASK_ID_MAX",
    "DeadLetterId",
    "cell",
    "dead_letter_json",
    "dead_letter_row",
    "human_date",
    "human_iso",
    "iso",
    "parse_before",
    "parse_dead_letter_id",
    "parse_state",
    "parse_task_id",
    "record_json",
    "table",
    "to_json",
    "transition_json",
    "usage",
]

#: A table cell is cut to this many characters (the whole value is in ``show`` and --json).
MAX_CELL = 48
_DURATION_RE = re.compile(r"(?P<n>\d+)(?P<unit>[smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


# ---------------------------------------------------------------------------- parsing
def parse_state(value: str | None) -> TaskState | None:
    """A ``--state`` value; an unknown one is a usage error listing the valid states."""
    if value is None:
        return None
    try:
        return TaskState(value.strip().lower())
    except ValueError:
        raise click.BadParameter(
            f"unknown state {value!r}; valid states: {', '.join(s.value for s in TaskState)}",
            param_hint="'--state'") from None


def parse_task_id(value: str) -> str:
    """A task id as given, whatever its characters (Celery runs any string); one no store
    can hold (:func:`~jobbers_celery.deadletter.selection.check_task_id`) is a usage error
    (nothing is looked up)."""
    try:
        return check_task_id(value)
    except DlqUsageError as exc:
        raise usage(exc) from None


def parse_dead_letter_id(value: str) -> DeadLetterId:
    """A dead-letter entry id: ``TASK_ID`` or ``TASK_ID:ATTEMPT``."""
    try:
        return DeadLetterId.parse(value)
    except DlqUsageError as exc:
        raise usage(exc) from None


def usage(exc: DlqUsageError) -> click.UsageError:
    """The dead-letter model's usage error as click's (exit 2): an id names the ``ID``
    argument (``Invalid value for 'ID': ...``)."""
    if isinstance(exc, DlqIdError):
        return click.BadParameter(exc.message, param_hint="'ID'")
    return click.UsageError(exc.message)


def parse_before(value: str | None, now: datetime) -> datetime | None:
    """``--submitted-before``: an ISO-8601 date or time (UTC unless it says otherwise), or
    an age such as ``7d``, ``12h``, ``30m`` (that long before ``now``)."""
    if value is None:
        return None
    text = value.strip()
    age = _DURATION_RE.fullmatch(text)
    if age:
        return now - timedelta(**{_UNITS[age["unit"]]: int(age["n"])})
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither an ISO-8601 date/time (2026-11-01, 2026-11-01T12:00Z) "
            "nor an age (30m, 12h, 7d, 2w)", param_hint="'--submitted-before'") from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


# ---------------------------------------------------------------------------- dates
def human_date(value: datetime | None) -> str:
    """Every date a person reads: ``2026-11-26 15:47:32 UTC`` (the one format)."""
    return human_time(value)


def iso(value: datetime | None) -> str | None:
    """Every date a script reads: ``2026-11-26T15:47:32.120Z`` (the one format)."""
    return iso_time(value)


def progress_text(value: Any) -> str | None:
    """A reported progress as people read it, as the admin shows it
    (:mod:`jobbers_celery.core.progress`): ``chunk 11 of 60 (18%)``, a counter as a number,
    anything else as ``key: value`` text; ``None`` for none."""
    found = progress_shown(value)
    if found is None:
        return None
    if found.fraction is None or found.label.endswith("%"):
        return found.label
    return f"{found.label} ({found.percent}%)"


# ---------------------------------------------------------------------------- tables
def cell(value: Any, width: int = MAX_CELL) -> str:
    """One table cell: on one line (a newline shown as ``\\n``, every control character
    escaped), cut to ``width`` characters."""
    if value is None or value == "":
        return "-"
    if isinstance(value, datetime):
        return human_date(value)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    # cut before escaping too: a cell never escapes more than it can show
    text = printable(text[:width + 1])
    return text if len(text) <= width else text[:width - 3] + "..."


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
          optional: Sequence[str] = (), width: int | None = None) -> str:
    """Aligned columns (two spaces apart), a header row; ``(none)`` when there are no rows.
    Fitted to the terminal's width (:mod:`jobbers_celery.core.columns`: text cut, names
    and ids elided in the middle, then the ``optional`` columns left out, said below)."""
    cells = [[cell(v) for v in row] for row in rows]
    if not cells:
        return "(none)"
    shown, cut, dropped = fit_columns(list(headers), cells,
                                      width if width is not None else terminal_width(),
                                      optional)
    widths = [max(len(h), *(len(r[n]) for r in cut)) for n, h in enumerate(shown)]
    lines = [shown, *cut]
    text = "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)
    if dropped:
        text += f"\n(hidden at this width: {', '.join(dropped)}; --json has all)"
    return text


def fields(pairs: Iterable[tuple[str, Any]], blocks: Collection[str] = ()) -> str:
    """``label: value`` lines, values aligned, every value on its line with its control
    characters escaped; a multi-line value of a label in ``blocks`` (a traceback, an
    error message) is indented below it, its lines kept and the rest escaped."""
    items = list(pairs)
    width = max((len(k) for k, _ in items), default=0) + 1
    out: list[str] = []
    for key, value in items:
        if key in blocks and isinstance(value, str) and "\n" in value:
            out.append(f"{key}:")
            out.extend(f"    {line}" for line in
                       printable(value.rstrip("\n"), newlines=True).split("\n"))
            continue
        shown = (human_date(value) if isinstance(value, datetime)
                 else "-" if value is None or value == ""
                 else printable(value) if isinstance(value, str)
                 else printable(json.dumps(value, default=str, ensure_ascii=False)))
        out.append(f"{(key + ':').ljust(width)} {shown}")
    return "\n".join(out)


def to_json(value: Any) -> str:
    """The ``--json`` form: sorted keys, ISO dates, one document; the characters JSON
    leaves raw that a terminal could obey (DEL, C1 controls, bidi overrides, separators,
    lone surrogates) written as ``\\uXXXX`` escapes (the same JSON value)."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False,
                      default=lambda v: iso(v) if isinstance(v, datetime) else str(v))
    unsafe = unprintable(text) - {"\n"}  # a raw newline is the indentation's: outside strings
    return text.translate({ord(c): _json_escape(c) for c in unsafe}) if unsafe else text


def _json_escape(char: str) -> str:
    """``\\uXXXX``, as UTF-16 code units (a surrogate pair past the BMP)."""
    units = char.encode("utf-16-be", "surrogatepass")
    return "".join(f"\\u{int.from_bytes(units[n:n + 2], 'big'):04x}"
                   for n in range(0, len(units), 2))


# ---------------------------------------------------------------------------- reads, shown
def record_json(record: TaskRecord, red: Redactor) -> dict[str, Any]:
    """A task record as shown (error message, progress and checkpoint redacted); the keys
    of the REST API's ``TaskRecord`` (the dataclass's field names)."""
    return {
        "task_id": record.task_id, "name": record.name, "version": record.version,
        "queue": record.queue, "state": record.state.value, "attempt": record.attempt,
        "retry_attempt": record.retry_attempt, "worker": record.worker,
        "submitted_at": iso(record.submitted_at), "started_at": iso(record.started_at),
        "retried_at": iso(record.retried_at), "completed_at": iso(record.completed_at),
        "heartbeat_at": iso(record.heartbeat_at), "run_at": iso(record.run_at),
        "error": ({"type": record.error.type, "message": red.text(record.error.message)}
                  if record.error else None),
        "progress": red.value(record.progress), "checkpoint": red.value(record.checkpoint),
    }


def transition_json(step: Transition, red: Redactor) -> dict[str, Any]:
    return {"at": iso(step.at), "from_state": step.from_state.value,
            "to_state": step.to_state.value,
            "attempt": step.attempt, "worker": step.worker,
            "reason": red.text(step.reason) if step.reason else None}


def error_text(record: TaskRecord, red: Redactor) -> str | None:
    if record.error is None:
        return None
    message = red.text(record.error.message)
    return f"{record.error.type}: {message}" if message else record.error.type


def dead_letter_json(entry: DeadLetter, red: Redactor, params: Parameters | None,
                     now_state: str | None = None) -> dict[str, Any]:
    """A dead-letter entry as shown: arguments redacted by key and parameter name, its
    message and traceback lose credentials and the secret values of its own arguments."""
    args, kwargs = red.arguments(entry.args, entry.kwargs, params)
    known = red.secrets(entry.args, entry.kwargs, params)
    return {
        "id": f"{entry.task_id}:{entry.attempt}", "task_id": entry.task_id,
        "attempt": entry.attempt, "retry_attempt": entry.retry_attempt, "name": entry.name,
        "version": entry.version, "queue": entry.queue, "reason": entry.reason,
        "args": args, "kwargs": kwargs,
        "exception_type": entry.exception_type,
        "exception_message": (red.text(entry.exception_message, known)
                              if entry.exception_message else None),
        "traceback": red.text(entry.traceback, known) if entry.traceback else None,
        "worker": entry.worker, "failed_at": iso(entry.failed_at),
        "checkpoint": red.value(entry.checkpoint),
        "unpublishable": entry.unpublishable,
        "task_state_now": now_state,
    }


def dead_letter_row(shown: Mapping[str, Any]) -> list[Any]:
    """One ``dlq list`` row from :func:`dead_letter_json`."""
    exc = shown["exception_type"] or ""
    if shown["exception_message"]:
        exc = f"{exc}: {shown['exception_message']}" if exc else shown["exception_message"]
    return [shown["id"], shown["name"], shown["version"], shown["queue"], shown["reason"],
            exc, human_iso(shown["failed_at"]), shown["task_state_now"] or "gone"]


DEAD_LETTER_HEADERS = ("ID", "TASK", "VER", "QUEUE", "REASON", "EXCEPTION", "FAILED AT",
                       "TASK NOW")


def worker_json(worker: WorkerInfo) -> dict[str, Any]:
    return {"incarnation": worker.incarnation, "hostname": worker.hostname,
            "pid": worker.pid, "last_seen_at": iso(worker.last_seen_at),
            "running": worker.running}


def cleaner_json(status: CleanerStatus) -> dict[str, Any]:
    return {"last_run_at": iso(status.last_run_at),
            "last_duration_ms": status.last_duration_ms, "by": status.by,
            "overdue": status.overdue}


def clean_json(report: CleanReport) -> dict[str, Any]:
    out = report.as_dict()
    out["at"] = iso(report.at)
    out["resumed_at"] = iso(report.resumed_at)
    return out


def human_iso(value: str | None) -> str:
    """An ISO date of a JSON form, as people read dates."""
    return human_date(datetime.fromisoformat(value)) if value else "-"
