"""The composition root of jobbers_celery: one app's store, dead-letter dispatcher and services.

:class:`Composition` builds the store, the dead-letter dispatcher, the recorder, the
publisher and the cleaner (and a worker's scheduler), handing each what it uses and nothing
more, so that the services below it never import it back (``tests/unit/test_layers.py``).
:class:`~jobbers_celery.jobbers.Jobbers` extends it with a worker's scheduler, the registry
of installed instances and the public reads and actions.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from kombu.utils.imports import symbol_by_name

from jobbers_celery.alerts.service import Alerts
from jobbers_celery.core.codec import PayloadCodec
from jobbers_celery.core.config import JobbersConfig
from jobbers_celery.core.records import DeadLetter
from jobbers_celery.core.redaction import redactor
from jobbers_celery.core.search import ArgumentIndex
from jobbers_celery.deadletter.dispatcher import DeadLetterDispatcher
from jobbers_celery.deadletter.sink import DeadLetterSink, PayloadDeadLetterSink
from jobbers_celery.deadletter.spool import DeadLetterSpool, spool_directory
from jobbers_celery.lifecycle import payload
from jobbers_celery.lifecycle.cleaner import Cleaner
from jobbers_celery.lifecycle.pausing import PauseControl
from jobbers_celery.lifecycle.periodic import PeriodicWatch
from jobbers_celery.lifecycle.publisher import Publisher
from jobbers_celery.lifecycle.recorder import Recorder
from jobbers_celery.lifecycle.search import ArgumentSearch
from jobbers_celery.resubmit.resubmit import ResubmitStore, Resubmitter
from jobbers_celery.store import CleanerStore, RedisStore, StepStore
from jobbers_celery.store.connect import redis_client
from jobbers_celery.store.parts import (
    AlertStore,
    DeadLetterStore,
    LayoutStore,
    PauseStore,
    PeriodicStore,
    RateLimitStore,
    RunningStore,
    RunStore,
    SearchStore,
    SeriesStore,
    UniqueStore,
    WorkflowStore,
)
from jobbers_celery.telemetry.history import CountHistory
from jobbers_celery.telemetry.series import Series

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["Composition", "JobbersStore", "ServiceStore"]


class ServiceStore(StepStore, CleanerStore, ResubmitStore, Protocol):
    """What the services :meth:`Jobbers.compose` builds use of a store, all parts together."""


class JobbersStore(ServiceStore, PauseStore, RunStore, RunningStore, LayoutStore, DeadLetterStore,
                   WorkflowStore, SearchStore, SeriesStore, AlertStore, PeriodicStore,
                   UniqueStore, RateLimitStore,
                   Protocol):
    """Every part a :class:`Jobbers` uses: its services', its reads' and the dead-letter
    dispatcher's (the Redis store, or the in-memory one of :mod:`jobbers_celery.testing`)."""


class Composition:
    """One app's store, dead-letter dispatcher and services, built once
    (:class:`~jobbers_celery.jobbers.Jobbers` is the one subclass)."""

    _count = itertools.count()

    def __init__(self, app: Celery, config: JobbersConfig, store: JobbersStore | None = None,
                 sink: DeadLetterSink | None = None) -> None:
        """``store`` and ``sink``: the ones to use instead of those ``config`` names (the
        in-memory fakes of :mod:`jobbers_celery.testing`); a store handed in gets no spool
        (an entry neither the sink nor that store takes waits in this process's memory)."""
        self._serial = next(Composition._count)
        self.app = app
        self.config = config
        spool = None
        if store is None:
            store = RedisStore(redis_client(config), config.key_prefix, config.retention,
                               config.store_shards)
            # entries that neither the sink nor Redis takes wait on local disk
            spool = DeadLetterSpool(spool_directory(config.dead_letter_spool,
                                                    config.key_prefix, config.redis_url))
        self.store: JobbersStore = store
        if sink is None:
            factory = symbol_by_name(config.dead_letter_sink)
            sink = factory(self)
        if not isinstance(sink, DeadLetterSink):
            raise TypeError(f"{config.dead_letter_sink} did not build a sink with write(entry)")
        self.sink: DeadLetterSink = sink
        # a sink that can hand entries back keeps the one copy of a dead task's payload
        self._payload_sink = (cast("PayloadDeadLetterSink", sink)
                              if callable(getattr(sink, "entry", None)) else None)
        # seals the arguments jobbers keeps, opens them where they are published again
        self.codec = PayloadCodec.of(config.payload_keys)
        self.compose(store, spool)

    def compose(self, store: JobbersStore, spool: DeadLetterSpool | None) -> None:
        """Build the dead-letter dispatcher and the services over ``store``: written once,
        for the Redis store and for the in-memory one of :mod:`jobbers_celery.testing`."""
        config = self.config
        self.alerts = Alerts(store, config)
        self.dead_letters = DeadLetterDispatcher(self.sink, store, written=self._written,
                                                 spool=spool)
        self.arguments = ArgumentSearch(
            store, ArgumentIndex.from_setting(config.indexed_arguments,
                                              redactor(tuple(config.redact_keys))),
            redactor(tuple(config.redact_keys)), self.codec, config.search_scan_limit,
            self._registered)
        self.recorder = Recorder(store, self.dead_letters,
                                 payload_warn_bytes=config.payload_warn_bytes,
                                 publish_lease_s=config.publish_lease, codec=self.codec,
                                 index=self.arguments.entries if self.arguments.index
                                 else None)
        self.publisher = Publisher(self.app, store, self.codec)
        self.pausing = PauseControl(self.app, store, config, self.publisher)
        self.cleaner = Cleaner(store, config, self.recorder, self.publisher,
                               alerts=self.alerts)
        self.resubmitter = Resubmitter(
            self.app, store, self.recorder, self.publisher,
            self._payload_sink.entry if self._payload_sink is not None else None,
            unopenable=lambda e: payload.unopenable(e.args, e.kwargs, self.codec),
            fresh_headers=(payload.HEADER_ENQUEUED_AT,))
        self.count_sampler = CountHistory(store)
        self.periodic = PeriodicWatch(store, config, emit=self.alerts.emit)
        self.series_reader = Series(store, config.history_days, config.history_max_names)

    def _registered(self, name: str) -> Any:
        """The task registered under ``name`` here, ``None`` before the app is finalized
        (reading ``app.tasks`` would finalize it, or raise with ``autofinalize=False``)."""
        finalized = getattr(self.app, "finalized", True)  # not in Celery's stubs
        return self.app.tasks.get(name) if finalized else None

    def _written(self, entries: Sequence[DeadLetter]) -> None:
        """The sink took ``entries``: counted for the dead-letter-rate alerts, and their
        records forget their copies of the payloads when the sink keeps them."""
        for entry in entries:
            self.alerts.dead_lettered(entry.name)
        if self._payload_sink is not None:
            self._drop_record_payloads(entries)

    def _drop_record_payloads(self, entries: Sequence[DeadLetter]) -> None:
        """The sink took ``entries``: their records forget their copies of the payloads."""
        self.store.drop_payloads([(e.task_id, e.attempt) for e in entries])
