"""Per-task SIGTERM policies (``on_shutdown``): what a worker's shutdown does to each task.

- ``stop``: the task is interrupted and ends ``stalled`` (reason: worker shutdown); it is
  not run again (its message, if the broker redelivers it, finds the record stalled).
- ``resubmit``: the task is interrupted and published again (same id, same retry count,
  checkpoint kept): ``started -> unsubmitted -> submitted``. It runs again exactly once: a
  redelivery of its old message and the new one race for the one ``submitted -> started``.
- ``continue``: the worker finishes it before exiting; its heartbeats and the worker's
  liveness keep flowing meanwhile, so the cleaner never calls it stalled.

How, per pool:

- prefork: on warm shutdown the shutdown step's ``close()`` (see :mod:`jobbers_celery.worker.runtime`) runs in the main process before the
  pool waits for its children, and interrupts the ``stop`` and ``resubmit`` tasks (SIGTERM
  to their child, which raises ``SystemExit`` in the task). The task applies its policy as
  it unwinds (``JobbersTask``). A task interrupted any other way (cold shutdown, SIGTERM to
  the whole process group) unwinds the same way; a ``continue`` task interrupted by force
  is resubmitted, so that nothing is lost.
- Celery checks for a shutdown signal once per pass of the worker's event loop, and an idle
  loop sleeps until its next timer: on an ``amqp://`` broker that can be 10 s (a Redis
  broker's loop wakes every second for its BRPOP). The shutdown step keeps a timer of
  ``WAKE_UP_S`` in the loop, so every policy is applied within about a second of the signal.
- threads, solo: a task cannot be interrupted. ``worker_shutting_down`` sets a flag in the
  process, and the task's next ``heartbeat()`` raises :class:`WorkerShuttingDown` for
  ``stop`` and ``resubmit``. A task that never heartbeats behaves as ``continue``.
"""

from __future__ import annotations

import importlib
import signal
import threading
from typing import Any

from jobbers_celery.core.printable import escaped_logger

__all__ = [
    "WorkerShuttingDown",
    "draining",
    "lives_on",
    "on_worker_init",
    "on_worker_shutting_down",
    "rearm_child_signals",
    "signalled",
]

log = escaped_logger("jobbers.shutdown")

_draining = threading.Event()

#: The longest a worker's event loop sleeps: how late it may notice a shutdown signal.
WAKE_UP_S = 1.0


class WorkerShuttingDown(BaseException):
    """Raised by ``heartbeat()`` in a ``stop`` or ``resubmit`` task while its worker shuts
    down (threads and solo pools). A ``BaseException``: task code must not swallow it."""


def drain() -> None:
    """Mark this process's worker as shutting down."""
    _draining.set()


def draining() -> bool:
    """Is this process's worker shutting down?"""
    return _draining.is_set()


def on_worker_shutting_down(**_: Any) -> None:
    # runs in a signal handler: set a flag, nothing else
    _draining.set()


def on_worker_init(**_: Any) -> None:
    """A worker starts in this process: it is not shutting down.

    The flag is process-wide and outlives the worker that set it: a process that starts
    another worker after one stopped (Celery's embedded test worker, ``start_worker`` and the
    ``celery_worker`` fixture) would otherwise hand back every task of the new one unrun.
    ``worker_init`` is what every worker sends as it is built (the embedded one sends no
    ``worker_ready``), before any task can run."""
    _draining.clear()


def rearm_child_signals() -> None:
    """Put billiard's terminate handler back in a prefork child that survived one.

    billiard's handler resets the signal to its default action when it fires (a second one
    means "exit now"). jobbers turns that ``SystemExit`` into a recorded policy and the child
    goes on serving tasks, so the next interruption must raise ``SystemExit`` again rather
    than kill the child before anything is recorded.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    common: Any = importlib.import_module("billiard.common")  # its stubs lack these names
    fired = getattr(common, "_should_have_exited", [False])
    if not fired[0]:
        return  # billiard's handler did not fire in this process (not a prefork child)
    for name in ("SIGTERM", "SIGQUIT", "SIGHUP"):
        num = getattr(signal, name, None)
        if num is not None and signal.getsignal(num) == signal.SIG_DFL:
            signal.signal(num, common._shutdown_cleanup)
    fired[0] = False


#: Request attribute: the pool whose process running it was sent SIGTERM (see lives_on).
_SIGNALLED = "_jobbers_signalled"


def signalled(request: Any, pool: Any) -> None:
    """Note that ``request``'s pool process was sent SIGTERM (``pool.terminate_job``)."""
    setattr(request, _SIGNALLED, pool)


def lives_on(request: Any) -> None:
    """``request`` answered from the prefork process it ran in after that process was sent
    SIGTERM (a revoke with terminate, an interruption): the task unwound and the process
    lives on (:meth:`JobbersTask._interrupted`), where billiard expects it to die. billiard
    marked it as terminating its job; unmarked here, its next death under another task (the
    OOM killer, a SIGKILL) would be reported as that task's termination (``Terminated``:
    REVOKED, recorded cancelled, never run again) instead of a lost worker process
    (``WorkerLostError``: requeued with ``reject_on_worker_lost``, or failed)."""
    pool = getattr(request, _SIGNALLED, None)
    if pool is None:
        return
    setattr(request, _SIGNALLED, None)
    try:
        proc, _ = pool._pool._process_by_pid(request.worker_pid)
    except Exception:  # not a billiard pool (it cannot be signalled), or gone
        log.debug("no pool process to unmark for %s", request.id, exc_info=True)
        return
    if proc is not None:
        proc._job_terminated = False  # billiard's marks (Pool.terminate_job)
        proc._controlled_termination = False


def interrupt(request: Any, pool: Any) -> None:
    """SIGTERM to the child running ``request`` (``NotImplementedError`` if the pool cannot).

    Not Celery's ``Request.cancel()``: it also marks the request done at once
    (``task_ready``), so the worker would stop counting the task as running while its child
    still applies the shutdown policy, or holds the outcome of a finished body until an
    unreachable store answers; the liveness refresh would then take it for a task whose end
    was lost and stall it. The request ends as any other when the child returns; the rest
    of ``cancel()`` is kept (should the child die of the signal, its message is left to the
    broker, as for a cancelled request)."""
    if request.time_start and request.worker_pid:
        pool.terminate_job(request.worker_pid, signal.SIGTERM)
        signalled(request, pool)
        request._already_cancelled = True
        request.send_event("task-cancelled")
