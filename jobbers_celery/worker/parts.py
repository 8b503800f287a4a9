"""What the tasks of one app use of its :class:`~jobbers_celery.jobbers.Jobbers`: each
collaborator of :class:`~jobbers_celery.worker.task.JobbersTask` built once, where it is
handed the parts it uses (store, recorder, publisher, config), so that the task never
reaches through the root into them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import Task

from jobbers_celery.lifecycle import results
from jobbers_celery.worker import taskrepr
from jobbers_celery.worker.delays import Delays
from jobbers_celery.worker.heartbeat import Heartbeats
from jobbers_celery.worker.outage import Handover
from jobbers_celery.worker.start import Starter

if TYPE_CHECKING:
    from jobbers_celery.core.redaction import Redactor
    from jobbers_celery.jobbers import Jobbers
    from jobbers_celery.lifecycle.publisher import Publisher
    from jobbers_celery.lifecycle.recorder import Recorder
    from jobbers_celery.store import LayoutStore, ResultWrite

__all__ = ["Parts"]


class Parts:
    """What the tasks of one app use of its :class:`Jobbers`, got once, where the
    collaborators are built (each when first used)."""

    def __init__(self, jobbers: Jobbers) -> None:
        self.jobbers = jobbers

    @functools.cached_property
    def recorder(self) -> Recorder:
        return self.jobbers.recorder

    @functools.cached_property
    def publisher(self) -> Publisher:
        return self.jobbers.publisher

    @functools.cached_property
    def heartbeats(self) -> Heartbeats:
        return Heartbeats(self.jobbers.store, self.jobbers.config.worker_lost_after)

    @functools.cached_property
    def handover(self) -> Handover:
        j = self.jobbers
        return Handover(j.store, j.recorder, j.publisher, j.config.worker_lost_after)

    @functools.cached_property
    def starter(self) -> Starter:
        j = self.jobbers
        return Starter(j.store, j.recorder, j.publisher, self.handover,
                       j.config.worker_lost_after)

    @functools.cached_property
    def delays(self) -> Delays:
        return Delays(self.jobbers.recorder, self.jobbers.publisher)

    @functools.cached_property
    def fold_result(self) -> Callable[[Task[Any, Any], Any], ResultWrite | None]:
        """Celery's result write, folded into the completion's script when it can be."""
        return functools.partial(_folded, self.jobbers.store)

    @functools.cached_property
    def redactor(self) -> Redactor:
        return taskrepr.redactor_of(self.jobbers.config)


def _folded(store: LayoutStore, task: Task[Any, Any], retval: Any) -> ResultWrite | None:
    return results.folded_result(task, store, retval)
