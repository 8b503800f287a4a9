"""Worker liveness: each worker's main process proves it is alive, so the cleaner can find
the tasks of a worker that died whole (SIGKILL, OOM, lost node) even when they never call
``heartbeat()``.

A worker *incarnation* id (hostname, pid, random suffix) is made in the main process when
the worker initialises; prefork children inherit it, so a task records which incarnation
runs it. A restarted worker with the same hostname is a new incarnation: the tasks of the
old one are still found. A thread (see :mod:`jobbers_celery.runtime`) refreshes the incarnation's entry every few seconds,
renews the ``max_concurrent`` leases of the capped tasks it runs, interrupts the tasks
whose ``cancel(terminate=True)`` grace has run out, and hands the cleaner the tasks recorded
as running here for longer than ``worker_lost_after`` that the worker does not run (their
end was lost with a Redis failover or restart). It runs until ``worker_shutdown``, after
the pool has drained, so tasks finishing during a warm shutdown are not taken for dead.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from jobbers_celery.config import JobbersConfig
    from jobbers_celery.options import TaskOptions
    from jobbers_celery.store import RedisStore

__all__ = ["Liveness", "gaps", "refresh_period", "set_worker_id", "worker_id"]

log = logging.getLogger("jobbers.liveness")

_wid: str | None = None


def set_worker_id(hostname: str | None) -> str:
    """Make this process's worker incarnation id (the worker's main process, at init)."""
    global _wid
    _wid = f"{hostname or socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
    return _wid


def worker_id() -> str:
    """The incarnation running tasks in this process (inherited by prefork children)."""
    return _wid if _wid is not None else set_worker_id(None)


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
#: (``task.OUTAGE_RESEND_MAX_PAUSE_S``).
ORPHAN_GRACE_MIN_MS = 10_000


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
    :meth:`refresh`, see :mod:`jobbers_celery.runtime`)."""

    def __init__(self, store: RedisStore, config: JobbersConfig, wid: str, pool: Any = None,
                 recover_orphans: Callable[[str, list[str]], object] | None = None) -> None:
        self.store = store
        self.config = config
        self.recover_orphans = recover_orphans  # the cleaner's, for the tasks found orphaned
        self.wid = wid
        self.pool = pool
        self._cant_terminate_logged = False

    def refresh(self) -> list[str]:
        """One refresh (one round trip); returns the ids it interrupted."""
        from celery.worker import state

        config = self.config
        running = {}
        leases = []
        for request in _snapshot(state.active_requests):
            running[request.id] = request
            # a jobbers task (JobbersTask, one layer up) states its options
            opts: TaskOptions | None = getattr(request.task, "jobbers_options", None)
            if opts is not None and opts.max_concurrent:
                leases.append((request.task.name, request.id))
        lost_ms = int(config.worker_lost_after * 1000)
        got = self.store.alive(
            self.wid, gaps(config), leases, lost_ms,
            running=list(running), orphan_ms=lost_ms,
            orphan_grace_ms=max(lost_ms, ORPHAN_GRACE_MIN_MS),
        )
        if got.orphans and self.recover_orphans is not None:
            self.recover_orphans(self.wid, got.orphans)
        interrupted = []
        for task_id in got.interrupt:
            request = running.get(task_id)
            if request is not None and self._terminate(request):
                interrupted.append(task_id)
        return interrupted

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
