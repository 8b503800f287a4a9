"""Worker liveness: each worker's main process proves it is alive, so the cleaner can find
the tasks of a worker that died whole (SIGKILL, OOM, lost node) even when they never call
``heartbeat()``.

A worker *incarnation* id (hostname, pid, random suffix) is made in the main process when
the worker initialises; prefork children inherit it, so a task records which incarnation
runs it. A restarted worker with the same hostname is a new incarnation: the tasks of the
old one are still found. A thread (see :mod:`jobbers_celery.worker.runtime`) refreshes the incarnation's entry every few seconds,
renews the ``max_concurrent`` leases of the capped tasks it runs, interrupts the tasks
whose ``cancel(terminate=True)`` grace has run out, and hands the cleaner the tasks recorded
as running here for longer than ``worker_lost_after`` that the worker does not run (their
end was lost with a Redis failover or restart). It runs until ``worker_shutdown``, after
the pool has drained, so tasks finishing during a warm shutdown are not taken for dead.

It also ends the attempts the cleaner declared stalled while this worker runs them (a
frozen task, or one whose worker was cut off from Redis), so that a frozen task does not
hold its pool slot for good: on prefork, SIGTERM to the child running it, SIGKILL if the
child is still busy with it ``HALT_GRACE_S`` later (billiard then replaces the child); the
stall entry of the attempt's history says how it ended. Threads and solo cannot stop a
running task: the worker logs a warning once per such attempt, and the history says so.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobbers_celery.core.printable import escaped_logger

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from jobbers_celery.core.config import JobbersConfig
    from jobbers_celery.core.options import TaskOptions
    from jobbers_celery.store import Halt, RunningStore

__all__ = ["HALTED", "HALT_GRACE_S", "Liveness", "ending", "gaps", "refresh_period",
           "set_worker_id", "worker_id"]

log = escaped_logger("jobbers.liveness")

_wid: str | None = None


def set_worker_id(hostname: str | None) -> str:
    """Make this process's worker incarnation id (the worker's main process, at init)."""
    global _wid
    _wid = f"{hostname or socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
    return _wid


def worker_id() -> str:
    """The incarnation running tasks in this process (inherited by prefork children)."""
    return _wid if _wid is not None else set_worker_id(None)


_ending: Counter[str] = Counter()
_ending_lock = threading.Lock()


@contextmanager
def ending(task_id: str) -> Iterator[None]:
    """While the main process records the end of ``task_id`` (a lost pool process, a hard
    time limit), the task still counts as run here: Celery's ``on_failure`` takes it out of
    the active requests first, and a refresh between that and the record would take the
    task for one whose end was lost (stalled and dead-lettered instead of failed)."""
    with _ending_lock:
        _ending[task_id] += 1
    try:
        yield
    finally:
        with _ending_lock:
            _ending[task_id] -= 1
            if _ending[task_id] <= 0:
                del _ending[task_id]


def _ending_here() -> list[str]:
    with _ending_lock:
        return list(_ending)


def refresh_period(worker_lost_after: float) -> float:
    """Seconds between liveness refreshes: at least five within ``worker_lost_after``."""
    return min(2.0, worker_lost_after / 5)


def gaps(config: JobbersConfig) -> tuple[int, int]:
    """How long a silence in Redis must be to count as an outage (see ``tick`` in _lib.lua),
    in ms: after a worker's refresh (three refresh periods, at least 1 s), and after a
    cleaner pass when no worker refreshes (2.5 cleaner intervals, at least the former)."""
    worker = int(max(3 * refresh_period(config.worker_lost_after), 1.0) * 1000)
    return worker, max(worker, int(2.5 * config.cleaner_interval * 1000))


#: After an outage, tasks recorded as running here that the worker does not run are judged
#: (as ends that were not recorded) no sooner than ``jobbers_worker_lost_after``, nor than
#: this: what the worker's own requests no longer show may still settle meanwhile, a
#: message given back taking back a start whose reply the outage lost, or a pool process
#: holding a finished task's outcome (Celery forgets a job whose acceptance it had not read
#: when its broker connection dropped) sending it again, at most 5 s apart
#: (``outage.OUTAGE_RESEND_MAX_PAUSE_S``).
ORPHAN_GRACE_MIN_MS = 10_000


#: Seconds a pool child gets to end a stalled attempt after SIGTERM (the task unwinds and
#: its refused steps cost a round trip) before it is killed with SIGKILL.
HALT_GRACE_S = 3.0

#: The flag on a request (Celery's, in the main process) whose stalled attempt its worker
#: ended: however its pool process reports the end (the task ignored, a ``Terminated`` or
#: ``WorkerLostError`` after SIGKILL), ``JobbersRequest`` only marks it done and acknowledges
#: its message, which the stall recovery has replaced (no failure, no revoke).
HALTED = "jobbers_halted"

#: The flag on a request's context that tells the main process's ``task_failure`` handler
#: the attempt's outcome is recorded (``task._DONE``, one layer up): a stalled attempt's is.
_OUTCOME_RECORDED = "jobbers_outcome_recorded"


#: The note on the stall of an attempt a threads or solo worker cannot stop.
_UNSTOPPABLE = "its worker's pool cannot stop it: it keeps its slot until it returns"


@dataclass(slots=True)
class _Halting:
    """A stalled attempt this worker signalled, until its request ends."""

    request: Any
    attempt: int
    verdict_at: float  # time.time() of the verdict, as seen here
    signalled_at: float  # time.monotonic() of the SIGTERM
    term_after_s: float  # since the verdict
    kill_after_s: float | None = None

    def note(self) -> str:
        kill = (f", SIGKILL {self.kill_after_s:.1f}s" if self.kill_after_s is not None
                else "")
        return f"ended by its worker (SIGTERM {self.term_after_s:.1f}s{kill} after the verdict)"


def _snapshot(requests: Any) -> list[Any]:
    """A copy of Celery's active-requests WeakSet, which the consumer changes meanwhile."""
    for _ in range(10):
        try:
            return list(requests)
        except RuntimeError:  # changed size during iteration: try again
            continue
    return []


class Liveness:
    """The liveness refresh of one worker incarnation (a thread of its main process calls
    :meth:`refresh`, see :mod:`jobbers_celery.worker.runtime`)."""

    def __init__(self, store: RunningStore, config: JobbersConfig, wid: str, pool: Any = None,
                 recover_orphans: Callable[[str, list[str]], object] | None = None) -> None:
        self.store = store
        self.config = config
        self.recover_orphans = recover_orphans  # the cleaner's, for the tasks found orphaned
        self.wid = wid
        self.pool = pool
        self._cant_terminate_logged = False
        #: stalled attempts signalled, by id() of their request (held until it ends)
        self._halting: dict[int, _Halting] = {}
        #: stalled attempts this pool cannot stop (threads, solo), by id() of their request
        self._unstoppable: dict[int, Any] = {}
        #: history notes not yet written (the next refresh carries them)
        self._notes: list[tuple[str, int, str]] = []

    def refresh(self) -> list[str]:
        """One refresh (one round trip); returns the ids it interrupted."""
        from celery.worker import state

        config = self.config
        running: dict[str, list[Any]] = {}
        leases = []
        # the active requests first, then the ends under way: Celery's on_failure enters
        # ending() before it takes the request out, so a task missing from the snapshot is
        # in ending() when it is read after it (or its end is recorded already)
        active = _snapshot(state.active_requests)
        ending = _ending_here()
        for request in active:
            running.setdefault(request.id, []).append(request)
            # a jobbers task (JobbersTask, one layer up) states its options
            opts: TaskOptions | None = getattr(request.task, "jobbers_options", None)
            if opts is not None and opts.max_concurrent:
                leases.append((request.task.name, request.id))
        self._follow_halts(active)
        lost_ms = int(config.worker_lost_after * 1000)
        notes = list(self._notes)
        sent_at = time.time()
        got = self.store.alive(
            self.wid, gaps(config), leases, lost_ms,
            running=list({*running, *ending}), orphan_ms=lost_ms,
            orphan_grace_ms=max(lost_ms, ORPHAN_GRACE_MIN_MS), notes=notes,
        )
        del self._notes[:len(notes)]
        if got.orphans and self.recover_orphans is not None:
            self.recover_orphans(self.wid, got.orphans)
        for halt in got.halts:
            # the verdict by this host's clock, at the latest (Redis measured its age)
            verdict_at = sent_at - max(0, got.now_ms - halt.verdict_ms) / 1000
            for request in running.get(halt.task_id, ()):
                self._halt(request, halt, verdict_at)
        interrupted = []
        for task_id in got.interrupt:
            for request in running.get(task_id, ()):
                if self._terminate(request):
                    interrupted.append(task_id)
        return interrupted

    def wake_in(self) -> float | None:
        """Seconds until a signalled stalled attempt is due for SIGKILL (``None``: none)."""
        due = [h.signalled_at + HALT_GRACE_S for h in self._halting.values()
               if h.kill_after_s is None]
        return max(0.0, min(due) - time.monotonic()) if due else None

    # ------------------------------------------------------------------ stalled attempts
    def _halt(self, request: Any, halt: Halt, verdict_at: float) -> None:
        """End ``request`` if it runs the stalled attempt: accepted before the verdict (a
        later attempt of the same task, which this worker may also run, came after it)."""
        key = id(request)
        if key in self._halting or key in self._unstoppable:
            return
        accepted = getattr(request, "time_start", None)
        if not accepted or accepted >= verdict_at or self.pool is None:
            return
        from celery.worker import state

        if request not in state.active_requests:
            return  # ended since the snapshot
        ago = time.time() - verdict_at
        try:
            self.pool.terminate_job(request.worker_pid, signal.SIGTERM)
        except NotImplementedError:
            self._unstoppable[key] = request
            log.warning(
                "%s[%s] attempt %s was declared stalled %.1fs ago, but this worker's pool "
                "cannot stop a running task: it keeps its slot until it returns (its next "
                "heartbeat() raises AttemptSuperseded). Put timeouts on what such a task "
                "waits for, or run it on a prefork worker, which stops it and enforces "
                "time limits",
                request.name, request.id, halt.attempt, ago)
            self._notes.append((request.id, halt.attempt, _UNSTOPPABLE))
            return
        except Exception:
            log.exception("could not end %s[%s], declared stalled", request.name, request.id)
            return
        # Like shutdown.interrupt, not Request.cancel()/terminate(): the request stays
        # active until its child is done with it (so it can be killed if SIGTERM is not
        # enough), and its end is no revoke and no failure: the stall verdict recorded it.
        setattr(request, HALTED, True)
        request._already_cancelled = True  # and, whatever handles its end, no revoke...
        setattr(request._context, _OUTCOME_RECORDED, True)  # ...nor failure is recorded
        self._halting[key] = _Halting(request, halt.attempt, verdict_at, time.monotonic(), ago)
        log.warning("ending %s[%s] attempt %s: declared stalled %.1fs ago; SIGTERM to its "
                    "pool process %s", request.name, request.id, halt.attempt, ago,
                    request.worker_pid)

    def _follow_halts(self, active: list[Any]) -> None:
        """Note the signalled attempts whose request has ended; SIGKILL the child of those
        still running ``HALT_GRACE_S`` after SIGTERM."""
        from celery.worker import state

        live = {id(r) for r in active}
        for key in [k for k in self._unstoppable if k not in live]:
            del self._unstoppable[key]
        now = time.monotonic()
        for key, halting in list(self._halting.items()):
            request = halting.request
            if key not in live:
                del self._halting[key]
                self._notes.append((request.id, halting.attempt, halting.note()))
                log.info("%s[%s] attempt %s ended (%s)", request.name, request.id,
                         halting.attempt, halting.note())
            elif (halting.kill_after_s is None and now - halting.signalled_at >= HALT_GRACE_S
                  and request in state.active_requests):  # not ended since the snapshot
                halting.kill_after_s = time.time() - halting.verdict_at
                try:
                    self.pool.terminate_job(request.worker_pid, signal.SIGKILL)
                except Exception:
                    log.exception("could not kill the pool process of %s[%s]", request.name,
                                  request.id)
                    continue
                log.warning("killing the pool process %s of %s[%s] attempt %s: still busy "
                            "with it %.1fs after SIGTERM", request.worker_pid, request.name,
                            request.id, halting.attempt, HALT_GRACE_S)

    def _terminate(self, request: Any) -> bool:
        if self.pool is None:
            return False
        try:
            request.terminate(self.pool, signal="SIGTERM")
            log.warning("interrupted %s[%s]: cancelled with terminate=True and its grace "
                        "period is over", request.name, request.id)
            return True
        except NotImplementedError:
            if not self._cant_terminate_logged:
                self._cant_terminate_logged = True
                log.warning("this worker's pool cannot interrupt a running task; cancelled "
                            "tasks stop at their next heartbeat (use the prefork pool for "
                            "cancel(terminate=True))")
        except Exception:
            log.exception("could not interrupt %s[%s]", request.name, request.id)
        return False
