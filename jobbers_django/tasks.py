"""The Celery task that drives paced resubmits (:mod:`jobbers_django.dlq.runs`), registered on
every Celery app by ``shared_task`` when Django loads this app (``JobbersConfig.ready``).

A ``JobbersTask``, so its own lifecycle is recorded like any task's. Each call is one
bounded step; the next is enqueued with a ``countdown``, which waits in jobbers' Redis
scheduler (no ETA message held by a worker). A worker killed mid-step leaves its attempt
stalled, and the cleaner recovers it (``max_stall_recoveries``); a warm shutdown lets it
finish (``on_shutdown="continue"``: a step is short, and interrupting it between its commit
and its publish would leave the claimed entries to ``publish_pending``, 30 s later). A step
running twice is harmless: the step holds the run's row lock and claims each item once.
"""

from __future__ import annotations

from celery import shared_task

from jobbers_celery import JobbersTask
from jobbers_django.dlq.runs import STEP_TASK

__all__ = ["resubmit_run_step"]

#: Seconds before a step that raised (database or Redis down) is tried again.
RETRY_AFTER = 5.0


@shared_task(base=JobbersTask, bind=True, name=STEP_TASK, max_retries=60,
             on_shutdown="continue", max_stall_recoveries=5)
def resubmit_run_step(self: JobbersTask, run_id: int, chain: str) -> str:
    """One step of paced resubmit ``run_id``; enqueues the next while the run needs one."""
    from jobbers_django.dlq import run_step

    try:
        delay = run_step.step(run_id, chain)
    except Exception as exc:
        raise self.retry(exc=exc, countdown=RETRY_AFTER) from exc
    if delay is None:
        return "chain ended"
    self.apply_async((run_id, chain), countdown=delay)
    return f"next step in {delay:g} s"
