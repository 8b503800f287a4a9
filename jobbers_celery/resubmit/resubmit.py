"""Resubmit: send failed, stalled, dropped or cancelled tasks back to the broker under their
own ids, from their records (:meth:`Resubmitter.resubmit`) or from their dead-letter
entries (:meth:`Resubmitter.resubmit_dead_letters`, what every DLQ front end and paced run
calls).

Each task moves back to ``submitted`` with a compare-and-set step that takes a publish lease
(the recorder's ``resubmit`` / ``resubmit_entry``), then is published; so at most one caller
publishes a given failure, however many race, and a publish that fails after its step is
published again by the scheduler when the lease expires.

The :class:`Resubmitter` is handed what it uses (narrow Protocols below): the store's reads,
the recorder's resubmit steps, the publisher, the sink's entries and the app's registry.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from jobbers_celery.core.codec import CannotOpen
from jobbers_celery.core.options import ResubmitVersion, TaskOptions
from jobbers_celery.core.printable import escaped_logger
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.core.states import RESUBMITTABLE, TaskState
from jobbers_celery.deadletter.payloadjson import loads
from jobbers_celery.store.base import StepResult

__all__ = ["App", "ResubmitPublisher", "ResubmitRecorder", "ResubmitStore", "Resubmitter"]

log = escaped_logger("jobbers")


class ResubmitStore(Protocol):
    def fields(self, ids: Sequence[str], names: Sequence[str]) -> list[list[str | None]]: ...
    def without_payload(self, ids: Sequence[str]) -> dict[str, int]: ...
    def confirm_published(self, ids: Iterable[str]) -> None: ...


class ResubmitRecorder(Protocol):
    """The recorder's resubmit steps (each one compare-and-set, with a publish lease)."""

    def resubmit(self, task_id: str, reset_retry_count: bool,
                 version: int | None = None) -> StepResult: ...
    def resubmit_entry(self, entry: DeadLetter, data: dict[str, Any], reset_retry_count: bool,
                       sources: frozenset[TaskState] | None, from_dlq: bool,
                       version: int | None = None) -> StepResult: ...
    def not_resubmitted(self, task_id: str, why: str) -> StepResult: ...


class ResubmitPublisher(Protocol):
    def republish(self, task_id: str, name: str, data: Mapping[str, Any], retries: int,
                  now_ms: int, *, resubmit: bool = False, version: str | None = None,
                  dead_letter: bool = False, producer: Any = None) -> None: ...


class App(Protocol):
    """The Celery app, as far as a resubmit uses it: its name, registry and producer pool."""

    @property
    def main(self) -> str | None: ...
    @property
    def tasks(self) -> Mapping[str, Any]: ...
    def producer_or_acquire(self, producer: Any = None) -> AbstractContextManager[Any]: ...


EntryReader = Callable[[str, int], DeadLetter | None]


class Resubmitter:
    """``entry``: the sink's reader of entries (``None``: the sink cannot hand entries back,
    so records always keep their payloads); ``unopenable``: why this process cannot publish
    an entry's sealed arguments (``None``: it can); ``fresh_headers``: headers a resubmit
    drops from the entry's message, as a new run has them anew (its first enqueue time)."""

    def __init__(self, app: App, store: ResubmitStore, recorder: ResubmitRecorder,
                 publisher: ResubmitPublisher, entry: EntryReader | None,
                 unopenable: Callable[[DeadLetter], str | None],
                 fresh_headers: Collection[str] = ()) -> None:
        self.app = app
        self.store = store
        self.recorder = recorder
        self.publisher = publisher
        self.entry = entry
        self.unopenable = unopenable
        self.fresh_headers = frozenset(fresh_headers)

    def resubmit(self, task_ids: Iterable[str], reset_retry_count: bool = True,
                 version: ResubmitVersion | str = ResubmitVersion.ENTRY) -> list[str]:
        """See :meth:`Jobbers.resubmit`."""
        published: list[str] = []
        ids = list(dict.fromkeys(task_ids))
        current: dict[str, int] = {}
        names: dict[str, str] = {}
        if ResubmitVersion(version) is ResubmitVersion.CURRENT and ids:
            names = {task_id: row[0] for task_id, row
                     in zip(ids, self.store.fields(ids, ("name",)), strict=True) if row[0]}
            current = self.current_versions(names.values())
        in_sink = self._payloads_in_sink(ids)
        for task_id in ids:
            as_version = current.get(names.get(task_id, ""))
            res = None
            if task_id not in in_sink:
                res = self.recorder.resubmit(task_id, reset_retry_count, version=as_version)
                if not res.applied and res.why == "no_msg" and self.entry is not None:
                    # its dead letter was written, and the record dropped its payload, since
                    # the read above: the entry holds the payload
                    in_sink[task_id] = self.entry(task_id, res.attempt)
            if task_id in in_sink:
                entry = in_sink[task_id]
                if entry is None:
                    log.error("task %s cannot be republished: its record holds no payload "
                              "and its dead-letter entry is gone", task_id)
                elif self._resubmit_dead_letter(entry, reset_retry_count, None,
                                                sources=RESUBMITTABLE, from_dlq=False,
                                                version=as_version):
                    published.append(task_id)
                continue
            if res is None or not res.applied:
                if res is not None and res.why == "no_msg":
                    log.error("task %s cannot be republished: its record holds no payload",
                              task_id)
                continue
            data: Any = loads(res.values["msg"])
            if data.get("unserializable") or not res.values.get("name"):
                why = ("its arguments were not recorded as JSON" if data.get("unserializable")
                       else "no task name was recorded")
                log.error("task %s cannot be republished: %s", task_id, why)
                self.recorder.not_resubmitted(task_id, why)
                self.store.confirm_published([task_id])
                continue
            if self._republish(task_id, res.values["name"], data, res.values, res.now_ms):
                published.append(task_id)
        self.store.confirm_published(published)
        return published

    def current_versions(self, names: Iterable[str]) -> dict[str, int]:
        """See :meth:`Jobbers.current_versions`."""
        found: dict[str, int] = {}
        missing: list[str] = []
        tasks = self.app.tasks
        for name in sorted(set(names)):
            opts = getattr(tasks.get(name), "jobbers_options", None)
            if isinstance(opts, TaskOptions):
                found[name] = opts.version
            else:
                missing.append(name)
        if missing:
            raise ValueError(
                f"cannot resubmit as the current version: {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not registered as a JobbersTask in "
                f"this process's Celery app {self.app.main!r}; import the task module here, "
                "or resubmit with the entry's version")
        return found

    def _payloads_in_sink(self, ids: list[str]) -> dict[str, DeadLetter | None]:
        """The dead-letter entries holding the payloads of those ``ids`` whose records hold
        none (``None``: the entry is gone too)."""
        if self.entry is None or not ids:
            return {}
        return {task_id: self.entry(task_id, attempt)
                for task_id, attempt in self.store.without_payload(ids).items()}

    def resubmit_dead_letters(
        self, entries: Iterable[DeadLetter], reset_retry_count: bool = True,
        version: ResubmitVersion | str = ResubmitVersion.ENTRY,
    ) -> list[str]:
        """See :meth:`Jobbers.resubmit_dead_letters`."""
        batch = list(entries)
        current: dict[str, int] = {}
        if ResubmitVersion(version) is ResubmitVersion.CURRENT:
            current = self.current_versions(e.name for e in batch if not e.unpublishable)
        published: list[str] = []
        seen: set[str] = set()
        # one producer (one broker connection) for the whole batch, not one per message
        with self.app.producer_or_acquire() as producer:
            for entry in batch:
                if entry.task_id not in seen:
                    seen.add(entry.task_id)
                    if self._resubmit_dead_letter(entry, reset_retry_count, producer,
                                                  version=current.get(entry.name)):
                        published.append(entry.task_id)
        self.store.confirm_published(published)
        return published

    def _resubmit_dead_letter(self, entry: DeadLetter, reset_retry_count: bool,
                              producer: Any, sources: frozenset[TaskState] | None = None,
                              from_dlq: bool = True, version: int | None = None) -> bool:
        """Resubmit with ``entry``'s payload (as ``version`` if given). ``from_dlq=False``:
        ``resubmit`` taking the payload of a record that dropped its copy (the history says
        "resubmitted")."""
        if entry.unpublishable:
            log.error("dead letter %s cannot be resubmitted: %s", entry.task_id,
                      entry.unpublishable)
            return False
        why = self.unopenable(entry)
        if why is not None:  # refused before any step: the entry stays as it is
            log.error("dead letter %s cannot be resubmitted by this process: %s",
                      entry.task_id, why)
            return False
        options = dict(entry.options or {})
        headers = {k: v for k, v in (options.get("headers") or {}).items()
                   if k not in self.fresh_headers}
        data = {"args": list(entry.args), "kwargs": dict(entry.kwargs),
                "options": {**options, "headers": headers}}
        res = self.recorder.resubmit_entry(entry, data, reset_retry_count, sources, from_dlq,
                                           version=version)
        if not res.applied:
            log.info("dead letter %s not resubmitted: the task is %s", entry.task_id,
                     res.previous)
            return False
        return self._republish(entry.task_id, entry.name, data, res.values, res.now_ms,
                               producer)

    def _republish(self, task_id: str, name: str, data: dict[str, Any],
                   values: dict[str, str], now_ms: int, producer: Any = None) -> bool:
        """Publish a task whose ``submitted`` step (with a publish lease) just applied."""
        try:
            self.publisher.republish(task_id, name, data, int(values.get("retries") or 0),
                                     now_ms, resubmit=True, version=values.get("ver") or None,
                                     dead_letter=bool(values.get("dlq")), producer=producer)
        except CannotOpen as exc:
            log.error("resubmitted task %s is not published by this process: %s; a worker "
                      "holding that key publishes it when its lease expires", task_id, exc)
            return False
        except Exception:
            log.exception("publishing resubmitted task %s failed; the scheduler will "
                          "publish it again when its lease expires", task_id)
            return False
        return True
