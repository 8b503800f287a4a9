"""``celery jobbers workflow ID``: a whole canvas (chain, group, chord) as one unit, found
from any of its members, its root or its group id; ``--cancel`` cancels its members,
``--resubmit`` sends its failed members back to the broker (a chord's callback then runs
once they complete).

The human form: the workflow's state, progress (k of n completed, failed, running), elapsed
time, the member that blocks it, then its members (the blocking ones marked ``*``) and its
own history. ``--json`` has the keys of the REST API's ``Workflow``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import click
from celery.bin.base import CeleryOption

from jobbers_celery.cli import output as out
from jobbers_celery.cli.base import Command, Env, Failure, NotFound, confirm, env, json_option
from jobbers_celery.core.printable import printable
from jobbers_celery.core.states import TaskState
from jobbers_celery.core.workflow import WorkflowState

if TYPE_CHECKING:
    from jobbers_celery.core.workflow import Workflow, WorkflowMember

__all__ = ["duration", "elapsed", "workflow", "workflow_json"]

#: How many members are read at most (``Jobbers.workflow``'s ``limit``).
_LIMIT = click.IntRange(1, 100_000)
#: The marker of a blocking member in the members table.
BLOCKS = "*"


def duration(delta: timedelta | None) -> str | None:
    """``1h 02m``, ``3m 05s``, ``12s``, ``3.4s``, ``340 ms`` (``None`` for ``None``)."""
    if delta is None:
        return None
    seconds = max(0.0, delta.total_seconds())
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f}s"
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def elapsed(member: WorkflowMember, now: datetime) -> timedelta | None:
    """How long a member has run: from its first start to its end (to ``now`` while it
    has not ended); ``None`` before it started."""
    record = member.record
    if record.started_at is None:
        return None
    return (record.completed_at or now) - record.started_at


def _seconds(delta: timedelta | None) -> float | None:
    return round(delta.total_seconds(), 3) if delta is not None else None


def workflow_json(task_id: str, flow: Workflow, now: datetime, e: Env) -> dict[str, Any]:
    """The REST API's ``Workflow``: its counts, times, blocking members, members (each with
    its record as ``show`` prints it) and history (reasons redacted)."""
    blocking = set(flow.blocking)
    red = e.redactor
    return {
        "task_id": task_id, "root_id": flow.root_id, "state": flow.state.value,
        "total": flow.total, "completed": flow.completed, "failed": flow.failed,
        "running": flow.running, "pending": flow.pending, "cancelled": flow.cancelled,
        "started_at": out.iso(flow.started_at), "ended_at": out.iso(flow.ended_at),
        "elapsed_seconds": _seconds(flow.elapsed), "blocking": list(flow.blocking),
        "truncated": flow.truncated,
        "members": [{"task_id": m.record.task_id, "role": m.role, "parent_id": m.parent_id,
                     "group_id": m.group_id, "blocking": m.record.task_id in blocking,
                     "elapsed_seconds": _seconds(elapsed(m, now)),
                     "record": out.record_json(m.record, red)} for m in flow.members],
        "history": [{"at": out.iso(t.at), "state": t.state.value, "task_id": t.task_id,
                     "reason": red.text(t.reason) if t.reason else None}
                    for t in flow.history],
    }


def _progress(flow: Workflow) -> str:
    return (f"{flow.completed} of {flow.total} completed, {flow.failed} failed, "
            f"{flow.running} running, {flow.pending} pending, {flow.cancelled} cancelled")


def _error(error: dict[str, Any] | None) -> str | None:
    """A member's error as ``record_json`` shows it (its message redacted)."""
    if error is None:
        return None
    return f"{error['type']}: {error['message']}" if error["message"] else str(error["type"])


def _human(shown: dict[str, Any], flow: Workflow, now: datetime) -> str:
    by_id = {m.record.task_id: m for m in flow.members}
    blocking = [f"{b} ({by_id[b].record.name}, {by_id[b].record.state.value})"
                if b in by_id else b for b in flow.blocking]
    rows = []
    for member, data in zip(flow.members, shown["members"], strict=True):
        r = member.record
        rows.append((BLOCKS if data["blocking"] else " ", r.task_id, r.name, member.role,
                     member.parent_id, member.group_id, r.state.value, r.attempt,
                     out.progress_text(data["record"]["progress"]), duration(elapsed(member, now)),
                     # an earlier attempt's error is not what a completed member says
                     None if r.state is TaskState.COMPLETED
                     else _error(data["record"]["error"])))
    parts = [
        out.fields([("Workflow", flow.root_id), ("State", flow.state.value),
                    ("Progress", _progress(flow)), ("Started", flow.started_at),
                    ("Ended", flow.ended_at), ("Elapsed", duration(flow.elapsed)),
                    ("Blocking", ", ".join(blocking) or None)]),
        "",
        (f"Members ({len(flow.members)}{', truncated' if flow.truncated else ''}; "
        f"{BLOCKS} blocks the workflow):"),
        out.table(("", "ID", "NAME", "ROLE", "PARENT", "GROUP", "STATE", "ATTEMPT",
                   "PROGRESS", "ELAPSED", "ERROR"), rows),
        "",
        "History:",
        out.table(("AT", "STATE", "TASK", "REASON"),
                  [(t.at, t.state.value, t.task_id, h["reason"])
                   for t, h in zip(flow.history, shown["history"], strict=True)]),
    ]
    if flow.truncated:
        parts.insert(1, f"(only the first {len(flow.members)} members are listed, and the "
                        "history is theirs; the state and counts cover all; --limit reads "
                        "more)")
    return "\n".join(parts)


@click.command(cls=Command)
@click.argument("task_id", metavar="ID")
@click.option("--cancel", "do_cancel", cls=CeleryOption, is_flag=True,
              help="Cancel every member not finished yet (asks to confirm).")
@click.option("--terminate", cls=CeleryOption, is_flag=True,
              help="With --cancel: also interrupt the running members in their workers "
                   "(prefork) after jobbers_cancel_grace.")
@click.option("--resubmit", "do_resubmit", cls=CeleryOption, is_flag=True,
              help="Send the failed members back to the broker, same ids (asks to confirm).")
@click.option("--keep-retry-count", cls=CeleryOption, is_flag=True,
              help="With --resubmit: keep each member's retry count (reset by default).")
@click.option("--yes", "-y", cls=CeleryOption, is_flag=True, help="Do not ask to confirm.")
@click.option("--limit", cls=CeleryOption, type=_LIMIT, default=1000, show_default=True,
              help="Read at most this many members.")
@json_option
@click.pass_context
def workflow(ctx: click.Context, task_id: str, do_cancel: bool, terminate: bool,
             do_resubmit: bool, keep_retry_count: bool, yes: bool, limit: int,
             as_json: bool) -> None:
    """A canvas as one unit: its state, progress and members, from any member's id.

    With --cancel or --resubmit, act on it: exit 0 if some member was cancelled or
    resubmitted, 1 if none was (nothing left to cancel, no failed member), 3 if no
    workflow has this id.
    """
    out.parse_task_id(task_id)
    if do_cancel and do_resubmit:
        raise click.UsageError("give --cancel or --resubmit, not both")
    if terminate and not do_cancel:
        raise click.UsageError("--terminate goes with --cancel")
    if keep_retry_count and not do_resubmit:
        raise click.UsageError("--keep-retry-count goes with --resubmit")
    e = env(ctx, as_json)
    flow = e.jobbers.workflow(task_id, limit=limit)
    if flow is None:
        raise NotFound(f"no workflow has the id {printable(task_id)} (no such task, or its "
                       "record expired)")
    if do_cancel:
        _cancel(ctx, e, task_id, flow, terminate, yes)
    elif do_resubmit:
        _resubmit(ctx, e, task_id, flow, not keep_retry_count, yes)
    else:
        now = e.jobbers.now()
        shown = workflow_json(task_id, flow, now, e)
        click.echo(out.to_json(shown) if as_json else _human(shown, flow, now))


def _ask(e: Env, flow: Workflow, question: str, yes: bool) -> bool:
    if yes:
        return True
    click.echo(out.fields([("Workflow", flow.root_id), ("State", flow.state.value),
                           ("Progress", _progress(flow))]), err=True)
    return confirm(question)


def _cancel(ctx: click.Context, e: Env, task_id: str, flow: Workflow, terminate: bool,
            yes: bool) -> None:
    answer: dict[str, Any] = {"task_id": task_id, "root_id": flow.root_id,
                              "terminate": terminate, "cancelled": []}
    if flow.state is not WorkflowState.RUNNING:  # ended: left as it is, never asked
        done: list[str] = []
    elif not _ask(e, flow, "Cancel every member of this workflow not finished yet?", yes):
        _emit(e, {**answer, "confirmed": False}, "Nothing cancelled.")
        return
    else:
        done = e.jobbers.cancel_workflow(task_id, terminate=terminate)
    answer.update(cancelled=done, confirmed=flow.state is WorkflowState.RUNNING)
    if not done:
        if e.as_json:
            click.echo(out.to_json(answer))
        raise Failure(f"workflow {printable(flow.root_id)} is {flow.state.value}: no member "
                      "left to cancel")
    _emit(e, answer, "\n".join([
        f"Workflow {printable(flow.root_id)}: {len(done)} member(s) cancelled, or asked to "
        "stop (a running one stops at its next heartbeat"
        + (", or is terminated" if terminate else "") + ")",
        out.table(("ID",), [(t,) for t in done])]))


def _resubmit(ctx: click.Context, e: Env, task_id: str, flow: Workflow, reset: bool,
              yes: bool) -> None:
    answer: dict[str, Any] = {"task_id": task_id, "root_id": flow.root_id,
                              "reset_retry_count": reset, "resubmitted": []}
    if not _ask(e, flow, "Send the failed members of this workflow back to the broker?", yes):
        _emit(e, {**answer, "confirmed": False}, "Nothing resubmitted.")
        return
    done = e.jobbers.resubmit_workflow(task_id, reset_retry_count=reset)
    answer.update(resubmitted=done, confirmed=True)
    if not done:
        if e.as_json:
            click.echo(out.to_json(answer))
        raise Failure(f"workflow {printable(flow.root_id)} has no failed member to resubmit")
    _emit(e, answer, "\n".join([
        (f"Workflow {printable(flow.root_id)}: {len(done)} failed member(s) resubmitted "
        f"(retry count {'reset' if reset else 'kept'})"),
        out.table(("ID",), [(t,) for t in done])]))


def _emit(e: Env, data: Any, human: str) -> None:
    click.echo(out.to_json(data) if e.as_json else human)
