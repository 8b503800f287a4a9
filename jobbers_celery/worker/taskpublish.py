"""The publish side of :class:`~jobbers_celery.worker.task.JobbersTask`, as a mixin: its
first publish (``apply_async``) and its retries (``retry()``, and the immediate retry
published once the attempt is over).

A delay, a first publish's ``countdown``/``eta`` or a retry's backoff, waits in the store
(:mod:`~jobbers_celery.worker.delays`), never in an ETA message at the broker; a fair-share
task whose key has no room is parked there too (a first publish, a chain's link, a retry:
:func:`~jobbers_celery.worker.start.fair_publish_key`), and so is a group's member, by the
group's bulk publish (:func:`fair_member_key`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from celery.exceptions import MaxRetriesExceededError, Retry
from celery.utils import uuid
from celery.utils.saferepr import saferepr

from jobbers_celery.core import softlimit
from jobbers_celery.core.fairshare import FairKey
from jobbers_celery.core.options import TaskOptions
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle import bulk, payload
from jobbers_celery.lifecycle.publisher import internal_publish_ms, publishing_unrecorded
from jobbers_celery.lifecycle.recorder import error_fields
from jobbers_celery.telemetry import tracing
from jobbers_celery.worker import heartbeat as hb
from jobbers_celery.worker import taskrepr
from jobbers_celery.worker import unique as unique_publish
from jobbers_celery.worker.delays import retry_delay, seconds_until
from jobbers_celery.worker.start import call_fair_key, fair_publish_key, release_after_end
from jobbers_celery.worker.taskbase import RUN, Revoked, S, TaskBase

log = escaped_logger("jobbers.task")

_DONE = hb.DONE
_RETRY_SIG = "jobbers_retry_sig"  # an immediate retry's message, sent by publish_retry
#: Characters of args/kwargs an error message quotes (Celery's argsrepr limit).
_REPR_MAX = 1024


def fair_member_key(task: Any, args: Any, kwargs: Any, options: dict[str, Any],
                    producer: Any) -> FairKey | None:
    """The fair-shares key of a ``concurrency_key`` task published as a group's member
    (``group_id``: a ``group``'s or a chord header's) through the group's bulk publish
    (``producer`` has ``jobbers_batch``: its step is held with the others, see
    :mod:`jobbers_celery.worker.bulk`), whose step then parks it when its key has no room,
    as a single publish is parked (:func:`~jobbers_celery.worker.start.fair_publish_key`):
    else the broker would get all of a large tenant's group, and a small tenant's task
    published after it wait for every one to be pulled. ``None``: another publish, a
    chain's link (a chain that is a group's member too) or a retry (a single publish's
    step parks those: ``fair_publish_key``), a republish, a delivery put back, a call
    whose arguments give no key (its start refuses it)."""
    opts: TaskOptions | None = getattr(task, "jobbers_options", None)
    if opts is None or opts.concurrency_key is None:  # most tasks: one attribute read
        return None
    if getattr(producer, "jobbers_batch", None) is None or not options.get("group_id") \
            or options.get("chain") or options.get("retries") \
            or internal_publish_ms() is not None or publishing_unrecorded():
        return None
    return call_fair_key(task, args, kwargs)


#: ``send_task`` arguments a task's ``apply_async`` cannot be handed (Celery's
#: ``apply_async`` passes its own, or they steer how the message is made).
_NOT_APPLY = frozenset({"task_type", "result_cls", "connection", "router", "publisher",
                        "route_name"})


def fair_send_task(app: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``app.send_task(name, args, kwargs, **options)`` (``args``/``kwargs``: the call's) of
    a task ``app`` has registered, a JobbersTask with a ``concurrency_key``, published by
    name (not by its own ``apply_async``, whose ``send_task`` names it: ``task_type``):
    that task's ``apply_async`` instead, so that its publish parks it when its key has no
    room, as ``delay`` would. Returns its ``AsyncResult``, or ``None``: not such a
    publish (a task not registered here, a republish, a message put back, arguments
    ``apply_async`` cannot take): ``send_task`` as Celery's (parked at its start).

    For the wrapper of ``app.send_task`` (``install``), before it sends."""
    options = dict(kwargs)
    name = args[0] if args else options.pop("name", None)
    if not isinstance(name, str) or len(args) > 3 or _NOT_APPLY & options.keys() \
            or internal_publish_ms() is not None or publishing_unrecorded():
        return None
    if app.conf.task_always_eager:
        return None  # Celery's send_task sends the message even then: so does this
    # the registry as Celery's send_task reads it (``app.tasks`` would finalize an app made
    # with autofinalize=False, and raise before it is)
    task = app._tasks.get(name)
    opts: TaskOptions | None = getattr(task, "jobbers_options", None)
    if opts is None or opts.concurrency_key is None or not isinstance(task, PublishMixin):
        return None
    call_args = args[1] if len(args) > 1 else options.pop("args", None)
    call_kwargs = args[2] if len(args) > 2 else options.pop("kwargs", None)
    check = getattr(task, "__header__", None) if task.typing else None
    if check is not None:
        try:  # arguments apply_async refuses: Celery's send_task sends them (the worker fails it)
            check(*(call_args or ()), **(call_kwargs or {}))
        except TypeError:
            return None
    return task.apply_async(call_args, call_kwargs, options.pop("task_id", None),
                            options.pop("producer", None), options.pop("link", None),
                            options.pop("link_error", None), options.pop("shadow", None),
                            **options)


class PublishMixin(TaskBase):
    """``apply_async`` and ``retry`` of a JobbersTask."""

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: str | None = None, **options: Any) -> Any:
        """Celery's ``apply_async``, except that a ``countdown`` or ``eta`` in the future
        waits in the store, not in an ETA message at the broker (which a Redis broker
        delivers again once its visibility timeout passes): the task is recorded
        ``scheduled`` (``run_at`` set, listed by ``scheduled()``) and a worker's scheduler
        publishes it when due, as it does a delayed retry. ``expires`` still counts from
        this call. If the store cannot take it, it goes out as Celery's ETA message."""
        spec = unique_publish.prepare(self, args, kwargs, options)
        if spec is not None:  # a unique publish: the holder's result if a copy holds it
            task_id = task_id or uuid()
            return unique_publish.settle(self, spec, task_id, self.apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, unique=False,
                **options))
        delay = seconds_until(options.get("countdown"), options.get("eta"))
        # a delivery put back (publishing unrecorded) goes out as Celery's ETA message
        if delay > 0 and not publishing_unrecorded() and Jobbers.find(self.app) is not None \
                and not self.app.conf.task_always_eager:
            later = self._parts().delays.publish_later(
                self, self.jobbers_options, args, kwargs, task_id, link, link_error, shadow,
                options, delay)
            if later is not None:
                return later
        fair = fair_publish_key(self, args, kwargs, options)
        if fair is not None and delay <= 0 and not publishing_unrecorded() \
                and Jobbers.find(self.app) is not None and not self.app.conf.task_always_eager:
            # fair shares: parked in the store when its key has no room, no message sent
            sent = self._parts().delays.publish_later(
                self, self.jobbers_options, args, kwargs, task_id, link, link_error, shadow,
                options, 0.0, fair=fair)
            if sent is not None:
                return sent
        if self.app.conf.task_send_sent_event and "argsrepr" not in options \
                and "kwargsrepr" not in options:
            self._redacted_reprs(args, kwargs, options)
        member = None if fair is not None or delay > 0 else fair_member_key(
            self, args, kwargs, options, producer)
        if member is not None:  # a group's member: parked by its batched step if no room
            with bulk.fair_member(member):
                return super().apply_async(args, kwargs, task_id, producer, link,
                                           link_error, shadow, **options)
        return super().apply_async(args, kwargs, task_id, producer, link, link_error, shadow,
                                   **options)

    def _redacted_reprs(self, args: Any, kwargs: Any, options: dict[str, Any]) -> None:
        """The ``task-sent`` event is built before ``before_task_publish`` (where every
        publish gets its redacted reprs): give it redacted ones too."""
        try:
            reprs = taskrepr.sent_reprs(self.app, self, args, kwargs,
                                        self._parts().redactor)
        except Exception:  # not installed, odd arguments: Celery's own reprs
            log.debug("no redacted reprs for the task-sent event of %s", self.name,
                      exc_info=True)
            return
        if reprs is not None:
            options["argsrepr"], options["kwargsrepr"] = reprs

    # ------------------------------------------------------------------ retries
    def release_fair_share(self) -> None:
        """After the attempt (``task_postrun``): a ``concurrency_key`` task's key lets its
        next parked task go now (see :func:`~jobbers_celery.worker.start.release_after_end`)."""
        if self.jobbers_options.concurrency_key is not None:
            release_after_end(self, getattr(self.request, RUN, None))

    def publish_retry(self) -> None:
        """Publish the immediate retry this attempt recorded (``started -> unsubmitted``),
        once the attempt is over: ``task_postrun`` calls it after Celery's tracer has stored
        RETRY. Published first (Celery's own order), the next attempt could end in another
        pool process before this RETRY is stored, which would then replace its FAILURE in
        the result backend for good (Celery keeps only a stored SUCCESS; plain Celery shows
        it with ``countdown=0``). The record holds a publish lease: if this process dies
        first, a scheduler publishes the recorded payload when the lease expires."""
        req = self.request
        sig = getattr(req, _RETRY_SIG, None)
        if sig is None:
            return
        setattr(req, _RETRY_SIG, None)
        self._parts().publisher.republish_signature(sig, leased=req.id)

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: Exception | None = None,
        throw: bool = True,
        eta: datetime | None = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Retry:
        """Retry with jobbers' backoff; a delay waits in Redis, never in an ETA message.

        ``countdown``/``eta`` override the task's backoff for this retry; without them a
        task that sets no ``retry_delay`` waits ``default_retry_delay``, as in Celery.
        """
        if not self._tracked():
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries,
                                 **options)
        with softlimit.shielded():  # record and publish the retry without interruption
            return self._retry(args, kwargs, exc, throw, eta, countdown, max_retries, options)

    def _retry(
        self, args: Any, kwargs: Any, exc: Exception | None, throw: bool,
        eta: datetime | None, countdown: float | None, max_retries: int | None,
        options: dict[str, Any], *, own: bool = False,
    ) -> Retry:
        """``own``: jobbers' retry of an ``expected_exceptions`` error or a timeout, which
        without ``retry_delay`` goes out at once; Celery's ``retry()`` then waits the task's
        ``default_retry_delay`` instead, as in Celery."""
        req = self.request
        limit = self.max_retries if max_retries is None else max_retries
        n = int(req.retries or 0) + 1
        if exc is not None:
            self._redact(exc)
        sig = self.signature_from_request(req, args, kwargs, retries=n, **options)
        if limit is not None and n > limit:
            # Celery's error, built as Celery.retry builds it (the arguments of the retry it
            # would have sent, a tuple and a dict); its text quotes them bounded (argsrepr's
            # limit), or a big payload would be copied into the record, the dead letter and
            # the result
            exceeded = cast("type[MaxRetriesExceededError]", self.MaxRetriesExceededError)
            error = exc or exceeded(
                f"Can't retry {self.name}[{req.id}] args:{saferepr(sig.args, _REPR_MAX)} "
                f"kwargs:{saferepr(sig.kwargs, _REPR_MAX)}",
                task_args=sig.args, task_kwargs=sig.kwargs,
            )
            self._redact(error)
            if self._fail(error, reason="retries exhausted"):
                raise Revoked("cancellation requested") from error
            raise error
        delay = retry_delay(self.jobbers_options, n, eta, countdown,
                            default=None if own else self.default_retry_delay)
        headers = dict(sig.options.get("headers") or {})
        tracing.stamp(headers)  # this attempt's span, if any: the retry continues its trace
        if headers:
            sig.options["headers"] = headers
        fields = {**self._pending_checkpoint(),
                  **(error_fields(exc) if exc is not None else {}), "retries": str(n)}
        setattr(req, _DONE, True)
        parts = self._parts()
        reason = f"retry {n}" + (f" of {limit}" if limit is not None else "")
        version = self.jobbers_options.version
        when: datetime | None = None
        if delay > 0:  # waits in the store, not in an ETA message
            res, when = parts.delays.retry_later(self._run(), sig, fields, reason=reason,
                                                 delay=delay, version=version,
                                                 ending=self._ending())
        else:
            try:
                data = payload.from_signature_options(sig.args, sig.kwargs, dict(sig.options))
                fields["msg"] = parts.recorder.encode(data)
            except TypeError:
                pass  # not JSON: the record keeps the payload it had
            # the publish lease: should this process die before publishing, a scheduler
            # publishes the recorded payload once the lease expires
            run, recorder = self._run(), parts.recorder
            res = self._ending()(lambda: recorder.retry_now(run, reason=reason, fields=fields,
                                                            version=version))
            if res.applied and res.state is S.UNSUBMITTED:
                # published (recording unsubmitted -> submitted) by publish_retry once
                # Celery's tracer has stored RETRY: sent now, the next attempt could end in
                # another pool process first and that late RETRY hide its FAILURE for good
                setattr(req, _RETRY_SIG, sig)
        if not res.applied:
            log.warning("retry of %s[%s] attempt %s not recorded: the task is %s",
                        self.name, req.id, self.attempt, res.previous)
        elif res.state is S.CANCELLED:
            log.info("%s[%s] was cancelled: not retried", self.name, req.id)
            raise Revoked("cancellation requested")
        retry = Retry(exc=exc, when=when)
        if throw:
            raise retry
        return retry
