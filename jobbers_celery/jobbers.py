"""Jobbers: one app's lifecycle store, dead-letter queue and read API (``install(app)``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kombu.utils.imports import symbol_by_name

from jobbers_celery import lifecycle, payload
from jobbers_celery.config import JobbersConfig
from jobbers_celery.records import TaskRecord, Transition
from jobbers_celery.sinks import DeadLetterDispatcher, DeadLetterSink
from jobbers_celery.states import RESUBMITTABLE, TaskState
from jobbers_celery.store import RedisStore

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["Jobbers"]

log = logging.getLogger("jobbers")


class Jobbers:
    """Reads are index-backed (never a keyspace scan); every change is one atomic step."""

    def __init__(self, app: Celery, config: JobbersConfig) -> None:
        self.app = app
        self.config = config
        self.store = RedisStore.from_url(config.redis_url, config.key_prefix, config.retention)
        factory = symbol_by_name(config.dead_letter_sink)
        sink = factory(self)
        if not isinstance(sink, DeadLetterSink):
            raise TypeError(f"{config.dead_letter_sink} did not build a sink with write(entry)")
        self.sink: DeadLetterSink = sink
        self.dead_letters = DeadLetterDispatcher(sink, self.store.client, self.store.keys)

    # ------------------------------------------------------------------ reads
    def get(self, task_id: str) -> TaskRecord | None:
        return self.store.get(task_id)

    def history(self, task_id: str) -> list[Transition]:
        """Every transition of the task, oldest first."""
        return self.store.history(task_id)

    def tasks(
        self,
        state: TaskState | str | None = None,
        name: str | None = None,
        queue: str | None = None,
        limit: int = 100,
    ) -> list[TaskRecord]:
        """Newest first."""
        return self.store.tasks(TaskState(state) if state is not None else None, name, queue,
                                limit)

    def scheduled(self, limit: int = 100) -> list[TaskRecord]:
        """Tasks waiting for a delayed retry, soonest ``run_at`` first."""
        return self.store.scheduled(limit)

    def counts(self) -> dict[TaskState, int]:
        return self.store.counts()

    # ------------------------------------------------------------------ actions
    def resubmit(self, task_ids: Iterable[str], reset_retry_count: bool = True) -> list[str]:
        """Send failed, stalled, dropped or cancelled tasks back to the broker (same id).

        Returns the ids actually resubmitted; others (unknown, running, completed, or
        already resubmitted by a concurrent caller) are skipped.
        """
        done: list[str] = []
        lease_ms = int(self.config.publish_lease * 1000)
        for task_id in dict.fromkeys(task_ids):
            fields = {"retries": "0"} if reset_retry_count else {}
            res = self.store.step(
                task_id, TaskState.SUBMITTED, sources=RESUBMITTABLE, lease_ms=lease_ms,
                reason="resubmitted" + (" (retry count reset)" if reset_retry_count else ""),
                set_fields=fields, ret=("msg", "retries", "name"),
            )
            if not res.applied:
                continue
            data: Any = payload.loads(res.values["msg"]) if res.values.get("msg") else {}
            if data.get("unserializable") or not res.values.get("name"):
                log.error("task %s cannot be republished: no JSON payload was recorded", task_id)
                continue
            headers = dict(data.get("options", {}).get("headers") or {})
            headers.pop(payload.HEADER_ENQUEUED_AT, None)
            data = {**data, "options": {**data.get("options", {}), "headers": headers}}
            try:
                with lifecycle.internal_publish(res.now_ms):
                    payload.republish(self.app, res.values["name"], task_id, data,
                                      int(res.values.get("retries") or 0))
            except Exception:
                log.exception("publishing resubmitted task %s failed; the scheduler will "
                              "publish it again when its lease expires", task_id)
                continue
            self.store.confirm_published([task_id])
            done.append(task_id)
        return done
