"""Pause and resume a task name or a queue on every worker.

The pause is written to the store first (durable: a worker started later reads it at its
start, and every worker reads the pauses again every ``jobbers_pause_poll_interval``),
then told to the live workers at once with a broadcast control command,
``jobbers_pauses`` (see :mod:`jobbers_celery.worker.pause`): each reads the pauses from
the store, applies them (a paused queue's consumer is cancelled as Celery's
``cancel_consumer`` does, and added back as ``add_consumer`` does) and replies. The
hostnames that replied are returned: from then on those workers hold the paused name's
messages. A worker that did not reply (remote control disabled, or busy past the
timeout) obeys within its poll interval.

A resume removes the pause, tells the workers, then publishes again every task the name
held, each under a publish lease (a scheduler publishes it if this process dies first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from jobbers_celery.core.pauses import Pause, PauseKind, validate_name
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.store import PauseStore, SchedulingStore

if TYPE_CHECKING:
    from celery import Celery

    from jobbers_celery.core.config import JobbersConfig
    from jobbers_celery.lifecycle.publisher import Publisher

__all__ = ["CONTROL_COMMAND", "PauseControl", "PauseOutcome", "PausedStore"]

log = escaped_logger("jobbers.pause")

#: The worker control command that makes a worker read and apply the pauses now.
CONTROL_COMMAND = "jobbers_pauses"
#: Seconds a pause or resume waits for the workers' replies.
REPLY_TIMEOUT_S = 1.0
#: Held tasks one resume publishes at most (the rest stay held: resume again).
RELEASE_MAX = 1_000_000


class PausedStore(PauseStore, SchedulingStore, Protocol):
    """What pausing uses of the store: the pauses, and the publish leases it confirms."""


@dataclass(frozen=True, slots=True)
class PauseOutcome:
    """What a pause or a resume did: ``changed`` (it was not paused / was paused),
    ``workers`` (hostnames that applied it at once), ``released`` (a resume: held tasks
    published again)."""

    kind: PauseKind
    target: str
    changed: bool
    workers: list[str] = field(default_factory=list)
    released: int = 0


class PauseControl:
    """Pauses and resumes (see the module)."""

    def __init__(self, app: Celery, store: PausedStore, config: JobbersConfig,
                 publisher: Publisher) -> None:
        self.app = app
        self.store = store
        self.config = config
        self.publisher = publisher

    def pause(self, kind: PauseKind | str, target: object, by: str = "code") -> PauseOutcome:
        k, name = validate_name(kind, target)
        changed = self.store.pause(k, name, by[:200])
        log.info("%s %s paused by %s", k.value, name, by)
        return PauseOutcome(k, name, changed, self.tell_workers())

    def resume(self, kind: PauseKind | str, target: object, by: str = "code") -> PauseOutcome:
        k, name = validate_name(kind, target)
        changed = self.store.unpause(k, name)
        workers = self.tell_workers()
        released = self.release(name) if k is PauseKind.TASK else 0
        log.info("%s %s resumed by %s (%d held tasks published again)", k.value, name, by,
                 released)
        return PauseOutcome(k, name, changed, workers, released)

    def pauses(self) -> list[Pause]:
        return self.store.pauses()

    def release(self, name: str) -> int:
        """Publish again the tasks ``name`` holds (none while it is paused again)."""
        lease_ms = int(self.config.publish_lease * 1000)
        reason = f"resumed: task {name} is no longer paused"
        done = seen = 0
        while seen < RELEASE_MAX:
            ids = [i for shard in self.store.held_ids(name) for i in shard]
            if not ids:
                break
            claimed = self.store.release(name, ids, lease_ms=lease_ms, worker=None,
                                         reason=reason)
            if claimed is None:
                break  # paused again
            now_ms = self.store.now_ms()
            published = []
            for item in claimed:
                try:
                    self.publisher.republish(item.task_id, item.name,
                                             self.publisher.payload_of(item.msg),
                                             item.retries, now_ms)
                    published.append(item.task_id)
                except Exception:
                    log.exception("could not publish held task %s; a scheduler publishes "
                                  "it when its lease runs out", item.task_id)
            self.store.confirm_published(published)
            seen += len(ids)
            done += len(claimed)  # not those cancelled while held (only forgotten)
        return done

    def tell_workers(self) -> list[str]:
        """Broadcast the control command; the hostnames that applied it (sorted)."""
        try:
            replies: list[dict[str, Any]] = self.app.control.broadcast(
                CONTROL_COMMAND, reply=True, timeout=REPLY_TIMEOUT_S) or []
        except Exception as exc:  # noqa: BLE001 - the broker is away: the polls apply it
            log.warning("could not tell the workers (they read the pauses within %ss): %s",
                        self.config.pause_poll_interval, exc)
            return []
        # a worker without jobbers answers {"error": ...}: it applied nothing
        return sorted(str(host)[:255] for reply in replies if isinstance(reply, dict)
                      for host, answer in reply.items()
                      if isinstance(answer, dict) and "ok" in answer)
