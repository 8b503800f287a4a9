"""Delays that wait in the store, never in an ETA message at the broker (which a Redis broker
delivers again once its visibility timeout passes): a first publish with a ``countdown`` or
``eta`` (``apply_async``), and a retry's delay. Either is recorded ``scheduled`` with its
payload, and a worker's scheduler publishes it when due.

:class:`Delays` is handed the recorder; the task (:mod:`jobbers_celery.worker.task`) decides
whether and how long to wait.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery import Task
from celery.utils import uuid

from jobbers_celery.core.backoff import compute_delay
from jobbers_celery.core.fairshare import FairKey
from jobbers_celery.core.options import DeadLetterPolicy, TaskOptions
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.states import TaskState
from jobbers_celery.core.unique import duplicate_of
from jobbers_celery.core.workflow import HEADER_WORKFLOW, WORKFLOW_CANCELLED
from jobbers_celery.lifecycle import payload, results
from jobbers_celery.store import UNREACHABLE, StepResult
from jobbers_celery.telemetry import tracing
from jobbers_celery.worker import bulk

if TYPE_CHECKING:
    from celery.canvas import Signature

    from jobbers_celery.lifecycle.publisher import Publisher
    from jobbers_celery.lifecycle.recorder import Recorder, Run
    from jobbers_celery.worker.outage import Ending

__all__ = ["Delays", "retry_delay", "seconds_until"]

log = escaped_logger("jobbers.task")
S = TaskState


class Delays:
    """Records delayed publishes and delayed retries (see the module)."""

    def __init__(self, recorder: Recorder, publisher: Publisher | None = None) -> None:
        self.recorder = recorder
        self.publisher = publisher

    def publish_later(self, task: Task[Any, Any], opt: TaskOptions, args: Any, kwargs: Any,
                      task_id: str | None, link: Any, link_error: Any, shadow: str | None,
                      options: dict[str, Any], delay: float, fair: FairKey | None = None
                      ) -> Any:
        """Record the first publish of ``task`` ``scheduled`` after ``delay`` seconds;
        returns its ``AsyncResult``, or ``None`` when it must go out as an ETA message
        instead (the options are built as Celery's ``apply_async`` builds them).
        ``fair`` (fair shares, no delay): parked the same way when its key has no room,
        else published now from what was recorded, as the scheduler publishes a due task
        (``None``: it goes out as Celery's publish); a first publish, a chain's link, or
        a retry (``retries``), whose record, ``unsubmitted`` since its attempt ended,
        takes the step and keeps its retry count."""
        check = getattr(task, "__header__", None) if task.typing else None
        if check is not None:
            check(*(args or ()), **(kwargs or {}))  # the TypeError apply_async raises
        namer: Callable[..., str | None] = task.shadow_name  # a subclass may name it
        opts: dict[str, Any] = {**task._get_exec_options(),  # type: ignore[attr-defined]
                                **options, "link": link, "link_error": link_error,
                                "shadow": shadow or namer(args, kwargs, options)}
        for key in ("countdown", "eta", "producer", "connection", "publisher"):
            opts.pop(key, None)
        opts.setdefault("ignore_result", task.ignore_result)
        parent = task.app.current_worker_task
        if parent is not None and parent.request.id:  # as send_task links it to its parent
            opts.setdefault("parent_id", parent.request.id)
            opts.setdefault("root_id", parent.request.root_id or parent.request.id)
        headers = dict(opts.get("headers") or {})
        tracing.stamp(headers)  # the publishing client's trace: the scheduler continues it
        opts["headers"] = headers
        task_id = task_id or uuid()
        links = link if isinstance(link, list | tuple) else [link] if link else []
        canvas = payload.workflow_of(  # its canvas, as a publish reads it from its message
            task.app, {"id": task_id, "root_id": opts.get("root_id"),
                       "parent_id": opts.get("parent_id"), "group": opts.get("group_id"),
                       HEADER_WORKFLOW: headers.get(HEADER_WORKFLOW)},
            (args, kwargs, {"chain": opts.get("chain"), "callbacks": list(links),
                            "chord": opts.get("chord")}))
        if canvas:  # the scheduler's publish, and what it publishes, stay in the workflow
            headers.setdefault(HEADER_WORKFLOW, canvas["wf"])
        routed = task.app.amqp.router.route(dict(opts), task.name, args, kwargs,
                                            task)  # type: ignore[arg-type]  # as Celery does
        queue = str(getattr(routed.get("queue"), "name", None) or routed.get("routing_key")
                    or "")
        why = "countdown" if options.get("countdown") else "eta"
        data = payload.deferred(args, kwargs, opts, queue, datetime.now(UTC))
        try:
            res = self.recorder.publish_later(
                task_id, task.name, data,
                version=opt.version, dead_letter=opt.dead_letter_policy is DeadLetterPolicy.SAVE,
                delay_ms=round(delay * 1000), reason=f"delayed first run ({why})",
                workflow=canvas, fair=fair)
        except TypeError:
            log.warning("%s[%s]: its publish options or arguments are not JSON: sent as an "
                        "ETA message, which waits at the broker", task.name, task_id)
            return None
        except UNREACHABLE:
            log.warning("%s[%s]: the state store cannot be reached: sent as an ETA message, "
                        "which waits at the broker", task.name, task_id)
            return None
        holder = duplicate_of(res.why)
        if holder is not None:  # a unique task's copy holds its lock: nothing recorded
            bulk.revoke_in_canvas(task.app, task_id, task.name, holder, opts)  # a canvas's
            return task.AsyncResult(holder)
        if res.applied and res.state is S.CANCELLED:  # its workflow was cancelled
            results.mark_revoked(task.app.backend, task_id, WORKFLOW_CANCELLED)
            return task.AsyncResult(task_id)
        if fair is not None and res.applied and res.state is S.SUBMITTED:
            if self.publisher is None:  # (a Delays built without one: none in a worker)
                raise RuntimeError("a fair-share publish needs the publisher")
            # a retry's message says its retry count, as its record does (a parked retry
            # is released with the record's)
            self.publisher.republish(task_id, task.name, data,
                                     int(options.get("retries") or 0), res.now_ms)
            return task.AsyncResult(task_id)
        if fair is not None and not res.applied:
            return None  # not recorded here (an id already known): Celery's own publish
        if not (res.applied and res.state is S.SCHEDULED):
            log.warning("%s[%s]: not recorded as a delayed first run (the task is %s): sent "
                        "as an ETA message", task.name, task_id, res.previous)
            return None
        return task.AsyncResult(task_id)

    def retry_later(self, run: Run, sig: Signature[Any], fields: dict[str, str], *,
                    reason: str, delay: float, version: int | None,
                    ending: Ending) -> tuple[StepResult, datetime]:
        """Record the retry ``sig`` of ``run`` ``scheduled`` ``delay`` seconds from now, with
        its payload (``fields`` gets it), under the attempt's outage policy ``ending``;
        returns the step's result and when it is due."""
        data = payload.from_signature_options(sig.args, sig.kwargs, dict(sig.options))
        fields["msg"] = self.recorder.encode(data)
        recorder, delay_ms = self.recorder, round(delay * 1000)
        res = ending(lambda: recorder.retry_later(run, reason=reason, delay_ms=delay_ms,
                                                  fields=fields, version=version))
        return res, datetime.now(UTC) + timedelta(seconds=delay)


def retry_delay(opts: TaskOptions, n: int, eta: datetime | None,
                countdown: float | None, default: float | None = None) -> float:
    """Seconds retry ``n`` waits: its ``eta`` or ``countdown``, else the task's backoff
    (``retry_delay``), else ``default``: Celery's ``default_retry_delay`` for a retry the
    task asked for with ``retry()``, ``None`` (at once) for jobbers' own retry of an
    expected exception."""
    if eta is not None:
        aware = eta if eta.tzinfo else eta.replace(tzinfo=UTC)
        return max(0.0, (aware - datetime.now(UTC)).total_seconds())
    if countdown is not None:
        return max(0.0, float(countdown))
    if opts.retry_delay is None:
        return max(0.0, float(default)) if default else 0.0
    return compute_delay(opts.backoff_strategy, opts.retry_delay, n, opts.max_retry_delay)


def seconds_until(countdown: Any, eta: Any) -> float:
    """Seconds a publish's ``countdown`` (which wins, as in Celery) or ``eta`` (naive: UTC)
    puts it off; 0 for neither, or one already past."""
    if countdown:
        return max(0.0, float(countdown))
    if not eta:
        return 0.0
    when = datetime.fromisoformat(eta) if isinstance(eta, str) else eta
    aware = when if when.tzinfo else when.replace(tzinfo=UTC)
    return max(0.0, (aware - datetime.now(UTC)).total_seconds())
