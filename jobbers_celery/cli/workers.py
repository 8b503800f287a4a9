"""``celery jobbers workers``, ``queues``, ``pauses``, ``pause`` and ``resume``: the
workers and queues as an operator sees them, and pausing a task name or a queue on every
worker (see :mod:`jobbers_celery.lifecycle.pausing`).

Exit 2 on bad input (neither or both of ``--task`` and ``--queue``, a name that is empty,
too long or not printable), 1 when the store or the broker cannot be reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from celery.bin.base import CeleryOption

from jobbers_celery.cli import output as out
from jobbers_celery.cli.base import Command, Env, env, json_option
from jobbers_celery.core.pauses import Pause, PauseError, PauseKind, validate_name
from jobbers_celery.core.progress import progress_shown

if TYPE_CHECKING:
    from jobbers_celery.lifecycle.fleet import QueueInfo, WorkerView
    from jobbers_celery.lifecycle.pausing import PauseOutcome

__all__ = ["COMMANDS", "pause", "pause_json", "pauses", "queue_json", "queues", "resume", "worker_json",
           "workers"]

_TIMEOUT = click.FloatRange(0.1, 30.0)


def worker_json(w: WorkerView) -> dict[str, Any]:
    """A worker as ``--json`` (and the REST API) show it."""
    live = w.liveness
    return {
        "hostname": w.hostname, "responded": w.responded, "pool": w.pool,
        "concurrency": w.concurrency, "pid": w.pid, "queues": w.queues,
        "last_seen_at": out.iso(live.last_seen_at) if live else None,
        "incarnation": live.incarnation if live else None,
        "running": [{"task_id": t.task_id, "name": t.name, "attempt": t.attempt,
                     "started_at": out.iso(t.started_at),
                     "heartbeat_at": out.iso(t.heartbeat_at), "progress": t.progress}
                    for t in w.running],
    }


def queue_json(q: QueueInfo) -> dict[str, Any]:
    return {"name": q.name, "depth": q.depth, "oldest_age_seconds": q.oldest_age_s,
            "oldest_task_id": q.oldest_task_id, "paused": q.paused,
            "consumers": q.consumers, "note": q.note or None}


def pause_json(p: Pause, held: int | None = None) -> dict[str, Any]:
    got: dict[str, Any] = {"kind": p.kind.value, "target": p.target, "at": out.iso(p.at),
                           "by": p.by}
    if p.kind is PauseKind.TASK:
        got["held"] = held
    return got


def _age(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    s = int(seconds)
    return f"{s // 3600}h {s % 3600 // 60:02d}m" if s >= 3600 else \
        f"{s // 60}m {s % 60:02d}s" if s >= 60 else f"{seconds:.1f}s"


def _progress(value: Any) -> str | None:
    """A reported progress as the admin reads it (``chunk 11 of 60``), ``None`` for none."""
    found = progress_shown(value)
    return None if found is None else found.label


def _emit(e: Env, data: Any, human: str) -> None:
    click.echo(out.to_json(data) if e.as_json else human)


@click.command(cls=Command)
@click.option("--timeout", cls=CeleryOption, type=_TIMEOUT, default=1.0, show_default=True,
              help="Seconds to wait for the workers' replies to inspect.")
@json_option
@click.pass_context
def workers(ctx: click.Context, timeout: float, as_json: bool) -> None:
    """Each worker: pool, queues, running tasks with their heartbeat and progress."""
    e = env(ctx, as_json)
    views = e.jobbers.worker_views(timeout)
    rows = []
    for w in views:
        live = w.liveness
        pool = f"{w.pool or '?'} x{w.concurrency}" if w.concurrency else (w.pool or "-")
        rows.append((w.hostname, pool, ",".join(w.queues), len(w.running),
                     live.last_seen_at if live else None,
                     "yes" if w.responded else "no reply"))
    running = [(w.hostname, t.task_id, t.name, t.attempt, t.started_at, t.heartbeat_at,
                _progress(t.progress)) for w in views for t in w.running]
    _emit(e, [worker_json(w) for w in views], "\n\n".join([
        out.table(("WORKER", "POOL", "QUEUES", "RUNNING", "LAST SEEN", "INSPECT"), rows,
                  optional=("LAST SEEN", "INSPECT")),
        "Running tasks:\n" + out.table(
            ("WORKER", "ID", "NAME", "ATTEMPT", "STARTED", "HEARTBEAT", "PROGRESS"), running,
            optional=("STARTED", "PROGRESS"))]))


@click.command(cls=Command)
@click.option("--timeout", cls=CeleryOption, type=_TIMEOUT, default=1.0, show_default=True,
              help="Seconds to wait for the workers' replies (which queues they consume).")
@json_option
@click.pass_context
def queues(ctx: click.Context, timeout: float, as_json: bool) -> None:
    """Each queue: depth, age of its oldest message, paused or not, its consumers."""
    e = env(ctx, as_json)
    infos = e.jobbers.queues(e.jobbers.worker_views(timeout))
    rows = [(q.name, q.depth, _age(q.oldest_age_s), "paused" if q.paused else "",
             ",".join(q.consumers), q.note) for q in infos]
    _emit(e, [queue_json(q) for q in infos],
          out.table(("QUEUE", "DEPTH", "OLDEST", "PAUSED", "CONSUMERS", "NOTE"), rows,
                    optional=("CONSUMERS", "NOTE")))


@click.command(cls=Command)
@json_option
@click.pass_context
def pauses(ctx: click.Context, as_json: bool) -> None:
    """The pauses in force, with the tasks each paused name holds."""
    e = env(ctx, as_json)
    got = e.jobbers.pauses()
    held = {p.target: e.jobbers.held_count(p.target) for p in got if p.kind is PauseKind.TASK}
    _emit(e, [pause_json(p, held.get(p.target)) for p in got],
          out.table(("KIND", "NAME", "SINCE", "BY", "HELD"),
                    [(p.kind.value, p.target, p.at, p.by, held.get(p.target)) for p in got]))


def _target(task: str | None, queue: str | None) -> tuple[PauseKind, str]:
    if (task is None) == (queue is None):
        raise click.UsageError("give one of --task NAME and --queue NAME")
    kind, name = (PauseKind.TASK, task) if task is not None else (PauseKind.QUEUE, queue)
    try:
        return validate_name(kind, name)
    except PauseError as exc:
        raise click.UsageError(str(exc)) from None


def _outcome_json(o: PauseOutcome) -> dict[str, Any]:
    return {"kind": o.kind.value, "target": o.target, "changed": o.changed,
            "workers": o.workers, "released": o.released}


def _report(e: Env, o: PauseOutcome, verb: str) -> None:
    was = "" if o.changed else f" (it was {'already' if verb == 'paused' else 'not'} paused)"
    lines = [f"{o.kind.value} {o.target} {verb}{was}",
             (f"workers that applied it now: {len(o.workers)} "
             "(the others within jobbers_pause_poll_interval)")]
    if verb == "resumed" and o.kind is PauseKind.TASK:
        lines.append(f"held tasks published again: {o.released}")
    _emit(e, _outcome_json(o), "\n".join(out.cell(line, 500) for line in lines))


_TASK = click.option("--task", cls=CeleryOption, default=None, metavar="NAME",
                     help="A task name: its messages are held until resumed.")
_QUEUE = click.option("--queue", cls=CeleryOption, default=None, metavar="NAME",
                      help="A queue: no worker consumes it until resumed.")


def _pause_command(name: str, verb: str, doc: str) -> click.Command:
    """``pause`` or ``resume`` (``verb``: ``paused`` or ``resumed``): one shape."""

    @click.command(name=name, cls=Command, help=doc)
    @_TASK
    @_QUEUE
    @json_option
    @click.pass_context
    def command(ctx: click.Context, task: str | None, queue: str | None, as_json: bool) -> None:
        kind, target = _target(task, queue)
        e = env(ctx, as_json)
        act = e.jobbers.resume if verb == "resumed" else e.jobbers.pause
        _report(e, act(**{"name" if kind is PauseKind.TASK else "queue": target}, by="cli"),
                verb)

    return command


pause = _pause_command("pause", "paused", "Pause a task name or a queue on every worker "
                       "(durable: later workers obey it).")
resume = _pause_command("resume", "resumed", "End a pause; a task name's held tasks are "
                        "published again.")


#: The commands this module adds to ``celery jobbers``.
COMMANDS = (workers, queues, pauses, pause, resume)
