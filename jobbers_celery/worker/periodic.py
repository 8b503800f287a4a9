"""The beat watch's Celery glue: what beat schedules and publishes, what workers run.

- ``beat_init`` (a beat process, standalone or ``worker -B``, whose app installed jobbers):
  hooks the running scheduler (``Service.scheduler``: the default ``PersistentScheduler``,
  django-celery-beat's ``DatabaseScheduler`` or any subclass of Celery's ``Scheduler``). Its
  entries are learned at start and every ``jobbers_periodic_check_interval``; each publish
  is recorded with its slot and the entry's next slot, and stamped with the header
  ``periodic_task_name`` (the one django-celery-beat stamps; Celery's own beat stamps
  only ``celery_beat_task``).
- ``celeryd_after_setup`` (a worker): learns ``app.conf.beat_schedule``'s entries not
  learned from a beat yet (``source="config"``), so that runs published by a beat without
  jobbers are still matched by task name.
- ``task_prerun`` / ``task_postrun`` (the process that runs the task): a message carrying
  the header (or Celery's ``celery_beat_task`` and a task name one config entry has)
  records the run's start (late? overlapping?) and its end, through :class:`RunWriter`:
  off the task's path (the task waits on no store round trip for the watch), in order,
  kept through a store outage, and sent before the process exits. Each is sent with its
  age (the time since it happened, on this process's monotonic clock), so the store
  records and judges the event's time, not the send's.

The judgement of missed slots runs in the workers' scheduler threads
(:meth:`~jobbers_celery.lifecycle.periodic.PeriodicWatch.maybe_judge`), not in beat: a
stopped beat must not be the only one to notice it stopped.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from celery import signals

from jobbers_celery.core.errors import StoreUnavailable
from jobbers_celery.core.periodic import bounded
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.lifecycle.periodic import PeriodicWatch, ScheduleInfo
from jobbers_celery.store.errors import is_outage
from jobbers_celery.worker.hooks import connect_each

__all__ = ["HEADER", "RunWriter", "connect", "hook_scheduler", "info_of", "writer"]

log = escaped_logger("jobbers.periodic")

#: The header naming a run's schedule (django-celery-beat's name for it).
HEADER = "periodic_task_name"
#: Celery's beat (>= 5.5) stamps this on everything it sends.
BEAT_HEADER = "celery_beat_task"

#: The schedule entry beat is publishing now (read by the publish signal).
_publishing: ContextVar[str | None] = ContextVar("jobbers_periodic_entry", default=None)


def _ms(delta: Any) -> float | None:
    return delta.total_seconds() * 1000 if isinstance(delta, timedelta) else None


def info_of(entry: Any, *, with_next: bool = True) -> ScheduleInfo:
    """What the watch learns of a beat ``ScheduleEntry``: the next slot from its
    ``last_run_at`` (``schedule.remaining_estimate``, no side effect, unlike a
    django-celery-beat entry's ``is_due``) and the period between the two next slots."""
    sched = entry.schedule
    next_in: float | None = None
    period = 0.0
    try:
        next_in = _ms(sched.remaining_estimate(entry.last_run_at))
        every = _ms(getattr(sched, "run_every", None))  # an interval: exact
        if every is not None:
            period = every
        elif next_in is not None:  # a crontab, solar...: from the next two slots
            after = sched.now() + timedelta(milliseconds=next_in)
            second = _ms(sched.remaining_estimate(after))
            period = round((second - next_in) / 1000) * 1000 if second is not None else 0.0
    except Exception:  # a schedule type without these: learned without its slots
        log.debug("cannot compute the slots of %s", entry.name, exc_info=True)
    return ScheduleInfo.of(entry.name, entry.task, sched, period,
                           next_in if with_next else None)


def hook_scheduler(scheduler: Any, watch: PeriodicWatch, beat: str) -> None:
    """Record what ``scheduler`` (a running beat's) schedules and publishes."""
    if getattr(scheduler, "_jobbers_watched", False):
        return
    scheduler._jobbers_watched = True
    apply_async, reserve, tick = scheduler.apply_async, scheduler.reserve, scheduler.tick
    reserved: dict[str, Any] = {}  # django-celery-beat keeps the reserved entry nowhere
    known: set[str] = set()
    every = watch.config.periodic_check_interval
    next_learn = [0.0]

    listed: list[set[str] | None] = [None]

    def learn() -> None:
        entries = list(scheduler.schedule.values())
        infos = [info_of(e, with_next=e.name not in known) for e in entries]
        names = {i.name for i in infos}
        # what beat no longer lists is looked for when its list changed (and at start)
        watch.learn(infos, "beat", beat=beat, complete=names != listed[0])
        listed[0] = names
        known.update(e.name for e in entries)

    def reserve_watched(entry: Any) -> Any:
        new = reserve(entry)
        reserved[entry.name] = new
        return new

    def apply_async_watched(entry: Any, producer: Any = None, advance: bool = True,
                            **kwargs: Any) -> Any:
        slot_in = info_of(entry).next_in_ms  # the due entry: its slot, now or passed
        asked = time.monotonic()
        token = _publishing.set(bounded(entry.name))
        try:
            result = apply_async(entry, producer=producer, advance=advance, **kwargs)
        finally:
            _publishing.reset(token)
        task_id = getattr(result, "id", None)
        if task_id:
            try:
                new = reserved.pop(entry.name, None) or scheduler.schedule.get(entry.name)
                info = info_of(new if new is not None else entry)
                # the store places the slot from its own clock when the record arrives:
                # the publish's time is taken off, or the slot would come after the run's
                # publish, even its start (a worker may start it before beat records it)
                waited = (time.monotonic() - asked) * 1000
                watch.published(info, str(task_id), round(min(0, slot_in or 0) - waited))
            except Exception:  # the watch never stops beat
                log.exception("could not record the publish of %s", entry.name)
        return result

    def tick_watched(*args: Any, **kwargs: Any) -> Any:
        if time.monotonic() >= next_learn[0]:
            next_learn[0] = time.monotonic() + every
            try:
                learn()
            except Exception:
                log.exception("could not record beat's schedule")
        return tick(*args, **kwargs)

    scheduler.reserve = reserve_watched
    scheduler.apply_async = apply_async_watched
    scheduler.tick = tick_watched


def on_beat_init(sender: Any = None, **_: Any) -> None:
    jobbers = Jobbers.find(getattr(sender, "app", None))
    if jobbers is None:
        return
    beat = getattr(sender, "hostname", None) or f"beat@{socket.gethostname()}"
    try:
        hook_scheduler(sender.scheduler, jobbers.periodic, beat)
    except Exception:
        log.exception("could not watch beat's scheduler; periodic runs are not watched")


def on_before_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
    name = _publishing.get()
    if name is not None and isinstance(headers, dict):
        headers.setdefault(HEADER, name)


def _config_names(app: Any) -> dict[str, str]:
    """task name -> schedule name, for the task names exactly one config entry runs."""
    found: dict[str, list[str]] = {}
    schedule = app.conf.beat_schedule or {}
    if isinstance(schedule, Mapping):
        for name, entry in schedule.items():
            if isinstance(entry, Mapping) and isinstance(entry.get("task"), str):
                found.setdefault(entry["task"], []).append(bounded(name))
    return {task: names[0] for task, names in found.items() if len(names) == 1}


def schedule_of(task: Any) -> str | None:
    """The schedule a running task's message came from, ``None`` if not from beat."""
    request = getattr(task, "request", None)
    name = getattr(request, HEADER, None)
    if isinstance(name, str) and name:
        return bounded(name)
    if getattr(request, BEAT_HEADER, None):
        matched = getattr(task.app, "_jobbers_beat_tasks", None)
        if matched is None:
            matched = task.app._jobbers_beat_tasks = _config_names(task.app)
        found = matched.get(str(getattr(task, "name", "")))
        return found if isinstance(found, str) else None
    return None


class RunWriter:
    """Writes a run's start and end for the task's thread, on a thread of its own.

    Why: each was a blocking store round trip in ``task_prerun``/``task_postrun``, two per
    periodic run on the task's path besides its own steps. The task's thread now only
    queues them (no store call); one thread per process sends them in order (a run's start
    before its end), waits out a store outage (``retry_s``; the old inline write was lost
    then), and :meth:`flush` sends what is left when the process exits (pool children run no
    ``atexit``: ``worker_process_shutdown``). What a process killed outright had queued and
    not sent (the moment of one round trip after a start or an end) is lost, as an inline
    write in flight was. At most ``limit`` writes wait; past it one is dropped, logged.
    """

    def __init__(self, retry_s: float = 60.0, limit: int = 10_000) -> None:
        self.retry_s = retry_s
        self.limit = limit
        self._lock = threading.Condition()
        self._queue: deque[tuple[str, Callable[[float], None], float]] = deque()
        self._busy = False
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._dropped = 0

    def after_fork(self) -> None:
        """In a forked child: the parent's queue, thread and lock (maybe held by its thread
        at the fork) are the parent's."""
        self._lock = threading.Condition()
        self._pid, self._queue, self._thread, self._busy = os.getpid(), deque(), None, False

    def put(self, what: str, write: Callable[[float], None]) -> None:
        """Queue ``write`` (``what``: its name in logs); never raises, never waits.
        ``write`` is handed the milliseconds since this put when it is sent."""
        if self._pid != os.getpid():  # forked by other means than os.fork
            self.after_fork()
        with self._lock:
            if len(self._queue) >= self.limit:
                self._dropped += 1
                if self._dropped == 1 or self._dropped % 1000 == 0:
                    log.warning("the beat watch dropped %d run write(s): %d wait already "
                                "(is the store down?)", self._dropped, self.limit)
                return
            self._queue.append((what, write, time.monotonic()))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="jobbers-periodic-writer")
                self._thread.start()
            self._lock.notify()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait up to ``timeout`` for every queued write to be sent; whether they were."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._pid != os.getpid():
                return True
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._lock.wait(min(left, 0.05))
        return True

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    self._busy = False
                    self._lock.notify_all()
                    self._lock.wait()
                what, write, since = self._queue.popleft()
                self._busy = True
            self._send(what, write, since)

    def _send(self, what: str, write: Callable[[float], None], since: float) -> None:
        deadline, pause = time.monotonic() + self.retry_s, 0.05
        while True:
            try:
                write(max(0.0, (time.monotonic() - since) * 1000))
                return
            except Exception as exc:  # the watch never affects a task
                if not (is_outage(exc) or isinstance(exc, StoreUnavailable)) \
                        or time.monotonic() + pause > deadline:
                    log.exception("could not record the %s", what)
                    return
            time.sleep(pause)
            pause = min(2 * pause, 1.0)


#: This process's writer of runs' starts and ends.
writer = RunWriter()
os.register_at_fork(after_in_child=writer.after_fork)


def on_task_prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    name = schedule_of(task) if task is not None else None
    if name is None or not task_id:
        return
    jobbers = Jobbers.find(task.app)
    if jobbers is not None:
        watch, task_name = jobbers.periodic, str(task.name)
        writer.put(f"start of periodic run {task_id}",
                   lambda age_ms: watch.started(name, task_id, task_name, age_ms))


def on_task_postrun(task_id: str | None = None, task: Any = None, state: str | None = None,
                    **_: Any) -> None:
    name = schedule_of(task) if task is not None else None
    if name is None or not task_id:
        return
    jobbers = Jobbers.find(task.app)
    if jobbers is not None:
        watch, ended, task_name = jobbers.periodic, state or "", str(task.name)
        writer.put(f"end of periodic run {task_id}",
                   lambda age_ms: watch.ended(name, task_id, ended, age_ms, task_name))


def on_process_exit(**_: Any) -> None:
    """Send the starts and ends still queued before the process goes."""
    if not writer.flush():
        log.warning("the beat watch could not record every run's start and end before "
                    "this process exits")


def on_worker_setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """Learn the config's entries a beat has not reported (no slot known from here)."""
    jobbers = Jobbers.find(getattr(instance, "app", None))
    if jobbers is None:
        return
    try:
        schedule = jobbers.app.conf.beat_schedule or {}
        infos = []
        for name, entry in schedule.items():
            if not jobbers.store.periodic_state(bounded(name)) and isinstance(entry, Mapping):
                sched = entry.get("schedule")
                seconds = (sched.total_seconds() if isinstance(sched, timedelta)
                           else float(sched) if isinstance(sched, int | float)
                           else getattr(getattr(sched, "run_every", None),
                                        "total_seconds", lambda: 0.0)())
                infos.append(ScheduleInfo.of(name, entry.get("task", ""), sched,
                                             seconds * 1000, None))
        jobbers.periodic.learn(infos, "config")
    except Exception:
        log.exception("could not learn beat_schedule")


def connect() -> None:
    """Connect the handlers once per process (idempotent through ``dispatch_uid``)."""
    connect_each((
        (signals.beat_init, on_beat_init, "jobbers.periodic.beat"),
        (signals.before_task_publish, on_before_publish, "jobbers.periodic.publish"),
        (signals.task_prerun, on_task_prerun, "jobbers.periodic.prerun"),
        (signals.task_postrun, on_task_postrun, "jobbers.periodic.postrun"),
        (signals.celeryd_after_setup, on_worker_setup, "jobbers.periodic.worker_setup"),
        (signals.worker_process_shutdown, on_process_exit, "jobbers.periodic.process_exit"),
        (signals.worker_shutdown, on_process_exit, "jobbers.periodic.worker_exit"),
    ))


atexit.register(on_process_exit)
