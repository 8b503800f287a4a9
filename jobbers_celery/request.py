"""JobbersRequest: runs in the worker's main process before a task reaches the pool.

A message whose ``jobbers_version`` header differs from the worker's registered version is
dropped here (recorded, dead-lettered when the task saves dead letters, rejected without
requeue) so it never occupies a pool slot. A request whose stalled attempt the worker ended
(see :mod:`jobbers_celery.liveness`) ends quietly, its message acknowledged.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker.request import Request
from celery.worker.state import task_ready

from jobbers_celery import metrics
from jobbers_celery.jobbers import Jobbers
from jobbers_celery.liveness import HALTED
from jobbers_celery.options import DeadLetterPolicy
from jobbers_celery.payload import HEADER_ENQUEUED_AT, HEADER_VERSION

__all__ = ["JobbersRequest", "VersionMismatch"]

log = logging.getLogger("jobbers.request")


class VersionMismatch(Exception):
    """The message was published for another version of the task than this worker runs."""


class JobbersRequest(Request):
    def on_failure(self, exc_info: Any, send_failed_event: bool = True,
                   return_ok: bool = False) -> Any:
        if getattr(self, HALTED, False):
            # its worker ended this stalled attempt (liveness): recorded, and replaced by
            # the recovery; Celery would leave a terminated task's message unacknowledged
            # (on RabbitMQ, holding a prefetch slot until the connection closes)
            task_ready(self)
            return self.acknowledge()
        return super().on_failure(exc_info, send_failed_event, return_ok)

    def revoked(self) -> bool:
        if self._already_revoked:
            return True
        got = self.request_dict.get(HEADER_VERSION)
        want = getattr(self.task, "version", None)
        if got is not None and want is not None and got != want:
            self._drop_version_mismatch(got, want)
            return True
        return bool(super().revoked())

    def _drop_version_mismatch(self, got: Any, want: Any) -> None:
        message = f"message version {got} differs from worker version {want}"
        log.warning("dropping %s[%s]: %s", self.task.name, self.id, message)
        exc = VersionMismatch(message)
        try:
            jobbers = Jobbers.of(self.task.app)
            policy = getattr(self.task, "jobbers_options", None)
            jobbers.recorder.drop(
                self.id, self.task.name, reason=message, worker=self.hostname, exc=exc,
                enqueued_ms=metrics.ms_value(self.request_dict.get(HEADER_ENQUEUED_AT)),
                dead_letter=policy is not None
                and policy.dead_letter_policy is DeadLetterPolicy.SAVE)
        except Exception:
            log.exception("could not record the drop of %s[%s]", self.task.name, self.id)
        self._already_revoked = True
        task_ready(self)
        self.task.backend.mark_as_failure(self.id, exc, request=self._context,  # type: ignore[attr-defined]
                                          store_result=self.store_errors)
        self.reject(requeue=False)
