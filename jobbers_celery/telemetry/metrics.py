"""OpenTelemetry metrics (docs/howto/metrics.md), through ``opentelemetry-api`` only.

No SDK is imported here: the instruments come from the API's global meter provider, which
is a no-op until the application installs an SDK ``MeterProvider`` (and they start
recording as soon as it does). Without ``opentelemetry-api`` installed (the ``otel`` extra)
every function here does nothing.

Recording is cheap on the hot path (the instruments are created once per process, on first
use) and never breaks a task: a failure is swallowed and logged at debug level.

Times are differences of Redis clock readings (the ``now`` of the steps and the
``jobbers_enqueued_at``/``jobbers_published_at`` headers), in milliseconds. No task id is
ever an attribute. ``docs/howto/metrics.md`` lists the instruments and what each attribute
means.

The observable gauges (tasks per state, dead-letter queue size, age of the cleaner's last
pass) are read from Redis and describe the whole cluster, so only one process reports
them: the one that holds a short Redis lease (``Keys.metrics_lease``), renewed whenever
that process collects. The other processes' callbacks observe nothing.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

try:
    from opentelemetry import metrics as _otel
except ImportError:  # the otel extra is not installed: every function is a no-op
    _otel = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

    from jobbers_celery.core.config import JobbersConfig
    from jobbers_celery.core.records import DeadLetter
    from jobbers_celery.store import MetricsStore

__all__ = [
    "ALERT_INSTRUMENTS",
    "GAUGES",
    "INSTRUMENTS",
    "PERIODIC_INSTRUMENTS",
    "ROLE_SCHEDULER",
    "ROLE_WORKER",
    "STATUS_RESUBMITTED",
    "STATUS_RETRIED",
    "alert",
    "attempt_ended",
    "dead_lettered",
    "periodic",
    "retried",
    "selected",
    "set_meter_provider",
    "store_emptied",
    "watch",
]

log = logging.getLogger("jobbers.metrics")

METER_NAME = "jobbers_celery"

#: ``role``: which component selected a task to run it.
ROLE_WORKER = "worker"  # a worker took its message off the broker and started it
ROLE_SCHEDULER = "scheduler"  # the in-worker scheduler claimed it when its run_at came

#: ``status`` values that end a task's run (end_to_end_latency is recorded for these only):
#: the terminal state the step moved the task to.
FINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "stalled", "dropped"})
#: The attempt ended and the task goes on: a retry (delayed or immediate) ...
STATUS_RETRIED = "retried"
#: ... or handed back without using a retry (``on_shutdown=resubmit``, ``Reject(requeue)``).
STATUS_RESUBMITTED = "resubmitted"

INSTRUMENTS = ("tasks_retried", "tasks_dead_lettered", "tasks_processed", "execution_time",
               "end_to_end_latency", "time_in_queue", "tasks_selected")
GAUGES = ("tasks_in_state", "dead_letter_queue_size", "cleaner_last_pass_age")
#: The beat watch's counters (``docs/howto/periodic.md``), by ``schedule`` and ``task``.
PERIODIC_INSTRUMENTS = ("periodic_runs_missed", "periodic_runs_late",
                        "periodic_runs_overlapping")
#: The alerts' counter (``docs/howto/alerts.md``), by ``kind`` and ``outcome``.
ALERT_INSTRUMENTS = ("alerts",)

#: Advisory histogram buckets (ms), from 5 ms to a day: jobbers tasks may run for hours.
#: An SDK ``View`` overrides them.
BUCKETS_MS: tuple[float, ...] = (
    5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000,
    300_000, 600_000, 1_800_000, 3_600_000, 7_200_000, 14_400_000, 43_200_000, 86_400_000,
)


class _Instruments:
    def __init__(self, provider: MeterProvider | None) -> None:
        assert _otel is not None
        meter = _otel.get_meter(METER_NAME, _version(), meter_provider=provider)
        count, ms = "{task}", "ms"
        self.retried = meter.create_counter(
            "tasks_retried", unit=count,
            description="Retries scheduled (delayed) or re-queued (immediate)")
        self.dead_lettered = meter.create_counter(
            "tasks_dead_lettered", unit=count,
            description="Entries sent to the dead-letter queue (failed, stalled, dropped)")
        self.processed = meter.create_counter(
            "tasks_processed", unit=count,
            description="Attempts that ended, and messages dropped, by how they ended")
        self.execution_time = meter.create_histogram(
            "execution_time", unit=ms, description="How long an attempt ran",
            explicit_bucket_boundaries_advisory=BUCKETS_MS)
        self.end_to_end = meter.create_histogram(
            "end_to_end_latency", unit=ms,
            description="From the first enqueue to the outcome that ended the task's run",
            explicit_bucket_boundaries_advisory=BUCKETS_MS)
        self.time_in_queue = meter.create_histogram(
            "time_in_queue", unit=ms,
            description="From publish (worker) or run_at (scheduler) to selection",
            explicit_bucket_boundaries_advisory=BUCKETS_MS)
        self.store_emptied = meter.create_counter(
            "store_emptied", unit="{event}",
            description="Times jobbers' Redis store was found emptied (restarted without "
                        "persistence, flushed), by key prefix; counted by the process "
                        "that reported it")
        self.selected = meter.create_counter(
            "tasks_selected", unit=count,
            description="Tasks selected to run: started by a worker, or claimed when due "
                        "by the scheduler")
        self.alerts = meter.create_counter(
            "alerts", unit="{alert}",
            description="Alert events by what became of them: sent, failed (a receiver), "
                        "suppressed (dedupe, rate limit), dropped (the queue was full)")
        self.periodic = {
            kind: meter.create_counter(
                f"periodic_runs_{kind}", unit="{run}",
                description=f"Periodic task runs {what}, by schedule and task")
            for kind, what in (("missed", "missed (beat published nothing for the slot)"),
                               ("late", "late (started, or not started, past the tolerance)"),
                               ("overlapping", "started while the previous run still ran"))}
        meter.create_observable_gauge(
            "tasks_in_state", callbacks=[_observe_states], unit=count,
            description="Records per lifecycle state (terminal ones until retention ends); "
                        "reported by one process per cluster")
        meter.create_observable_gauge(
            "dead_letter_queue_size", callbacks=[_observe_dead_letters], unit="{entry}",
            description="Entries in the dead-letter queue (sinks with size() only); "
                        "reported by one process per cluster")
        meter.create_observable_gauge(
            "cleaner_last_pass_age", callbacks=[_observe_cleaner], unit="s",
            description="Seconds since the cleaner's last pass began; reported by one "
                        "process per cluster")


def _version() -> str:
    try:
        return importlib.metadata.version("jobbers")
    except importlib.metadata.PackageNotFoundError:
        return ""


_lock = threading.Lock()
_instruments: _Instruments | None = None
_provider: MeterProvider | None = None
#: Where the gauges find the instances to report: ``Jobbers.installed``, the one registry
#: (set by ``install`` through :func:`watch`; this module does not import ``jobbers``).
_sources: Callable[[], Iterable[GaugeSource]] = tuple


class GaugeSource(Protocol):
    """What the gauges read of an installed instance (a ``Jobbers``)."""

    @property
    def store(self) -> MetricsStore: ...
    @property
    def sink(self) -> object: ...
    @property
    def config(self) -> JobbersConfig: ...


def _get() -> _Instruments | None:
    global _instruments
    found = _instruments
    if found is not None or _otel is None:
        return found
    with _lock:
        if _instruments is None:
            _instruments = _Instruments(_provider)
        return _instruments


def set_meter_provider(provider: MeterProvider | None) -> None:
    """Record through ``provider`` instead of the global meter provider (``None``: back
    to the global one). For tests, and applications that keep several providers."""
    global _instruments, _provider
    with _lock:
        _provider = provider
        _instruments = None
    _get()


def watch(sources: Callable[[], Iterable[GaugeSource]]) -> None:
    """Report the gauges of the instances ``sources()`` lists (``install`` passes
    ``Jobbers.installed``); creates the instruments."""
    global _sources
    _sources = sources
    try:
        _get()
    except Exception:  # metrics never break the application
        log.debug("could not create the jobbers instruments", exc_info=True)


# ---------------------------------------------------------------------- recording
def _attrs(task: str, queue: str | None, **more: str | int | None) -> dict[str, str | int]:
    out: dict[str, str | int] = {"task": task or "", "queue": queue or ""}
    out.update({k: v for k, v in more.items() if v is not None})
    return out


def ms_value(raw: Any) -> float | None:
    """A time stamp (ms) from a header or record field; ``None`` if absent or unreadable."""
    if raw is None or raw == "" or isinstance(raw, bool):
        return None
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def selected(task: str, queue: str | None, role: str, waited_ms: float | None) -> None:
    """A task was selected to run: ``tasks_selected`` and (when known) ``time_in_queue``."""
    found = _get()
    if found is None:
        return
    try:
        attrs = _attrs(task, queue, role=role)
        found.selected.add(1, attrs)
        if waited_ms is not None:
            found.time_in_queue.record(max(0.0, waited_ms), attrs)
    except Exception:  # metrics never break a task
        log.debug("could not record tasks_selected", exc_info=True)


def attempt_ended(
    task: str, queue: str | None, status: str, *, now_ms: float,
    started_ms: float | None = None, enqueued_ms: float | None = None,
) -> None:
    """An attempt ended (or a message was dropped): ``tasks_processed``, and
    ``execution_time`` when its start is known, ``end_to_end_latency`` when ``status``
    ends the task's run and its first enqueue is known."""
    found = _get()
    if found is None:
        return
    try:
        attrs = _attrs(task, queue, status=status)
        found.processed.add(1, attrs)
        if started_ms is not None:
            found.execution_time.record(max(0.0, now_ms - started_ms), attrs)
        if enqueued_ms is not None and status in FINAL_STATUSES:
            found.end_to_end.record(max(0.0, now_ms - enqueued_ms), attrs)
    except Exception:  # metrics never break a task
        log.debug("could not record tasks_processed", exc_info=True)


def store_emptied(prefix: str) -> None:
    """The store was found emptied (:mod:`jobbers_celery.lifecycle.emptied`)."""
    found = _get()
    if found is None:
        return
    try:
        found.store_emptied.add(1, {"prefix": prefix})
    except Exception:  # metrics never break anything
        log.debug("could not record store_emptied", exc_info=True)


def retried(task: str, version: int | None, queue: str | None) -> None:
    found = _get()
    if found is None:
        return
    try:
        found.retried.add(1, _attrs(task, queue, version=version))
    except Exception:  # metrics never break a task
        log.debug("could not record tasks_retried", exc_info=True)


def alert(kind: str, outcome: str) -> None:
    """An alert event of ``kind`` ``sent``, ``failed``, ``suppressed`` or ``dropped``."""
    found = _get()
    if found is None:
        return
    try:
        found.alerts.add(1, {"kind": kind, "outcome": outcome})
    except Exception:  # metrics never break a task
        log.debug("could not record alerts", exc_info=True)


def periodic(kind: str, schedule: str, task: str, count: int = 1) -> None:
    """A periodic run judged ``kind`` (``missed``, ``late``, ``overlapping``)."""
    found = _get()
    if found is None or count <= 0:
        return
    try:
        found.periodic[kind].add(count, {"schedule": schedule, "task": task})
    except Exception:  # metrics never break a task
        log.debug("could not record periodic_runs_%s", kind, exc_info=True)


def dead_lettered(entries: Iterable[DeadLetter]) -> None:
    found = _get()
    if found is None:
        return
    try:
        for entry in entries:
            found.dead_lettered.add(1, _attrs(entry.name, entry.queue, version=entry.version))
    except Exception:  # metrics never break a task
        log.debug("could not record tasks_dead_lettered", exc_info=True)


def started_ms(values: Mapping[str, str]) -> float | None:
    """When the running attempt started, from a step's returned ``start_at``/``retry_at``
    (``retry_at`` is the latest later start, when there was one)."""
    return ms_value(values.get("retry_at")) or ms_value(values.get("start_at"))


#: Record fields an ending step returns so that its attempt can be measured.
ATTEMPT_FIELDS = ("queue", "start_at", "retry_at")


# ---------------------------------------------------------------------- gauges
class _Lease:
    """This process's claim on the gauge lease of one jobbers namespace."""

    def __init__(self) -> None:
        self.token = ""
        self.pid = 0
        self.held = False
        self.checked = 0.0


_leases: weakref.WeakKeyDictionary[GaugeSource, _Lease] = weakref.WeakKeyDictionary()


def _holds_lease(jobbers: GaugeSource) -> bool:
    """Take or renew the gauge lease; the answer is reused for a short while, so that one
    collection (three callbacks) costs one round trip for it."""
    lease = _leases.get(jobbers)
    if lease is None:
        lease = _leases[jobbers] = _Lease()
    pid = os.getpid()
    if lease.pid != pid:  # a forked child is another process: it gets its own token
        lease.pid, lease.held, lease.checked = pid, False, 0.0
        lease.token = f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}"
    ttl = jobbers.config.metrics_gauge_lease
    now = time.monotonic()
    if now - lease.checked < min(1.0, ttl / 4):
        return lease.held
    lease.held = jobbers.store.hold_lease(jobbers.store.keys.metrics_lease, lease.token,
                                          int(ttl * 1000))
    lease.checked = now
    return lease.held


def _reporting() -> list[GaugeSource]:
    out = []
    for jobbers in list(_sources()):
        try:
            if _holds_lease(jobbers):
                out.append(jobbers)
        except Exception:  # Redis down: no gauges this time
            log.debug("could not take the jobbers gauge lease", exc_info=True)
    return out


def _observe_states(options: CallbackOptions) -> Sequence[Observation]:
    """Records per state, summed over the stores this process reports for: two installed
    instances on two stores would otherwise observe one attribute set twice, and the SDK
    keeps whichever came last. Instances on one store share its lease, so one reports."""
    assert _otel is not None
    summed: dict[str, int] = {}
    for jobbers in _reporting():
        try:
            counts = jobbers.store.counts()
        except Exception:
            log.debug("could not read the state counts", exc_info=True)
            continue
        for state, n in counts.items():
            summed[state.value] = summed.get(state.value, 0) + n
    return [_otel.Observation(n, {"state": state}) for state, n in summed.items()]


def _observe_dead_letters(options: CallbackOptions) -> Sequence[Observation]:
    """Entries summed over the sinks this process reports for (as ``tasks_in_state``),
    each queue once: sinks that name the same queue (``size_scope``, e.g. one database
    table for every instance of a Django process) count once."""
    assert _otel is not None
    sizes: dict[object, int] = {}
    for jobbers in _reporting():
        sink = jobbers.sink
        size = getattr(sink, "size", None)
        if not callable(size):
            continue
        scope = getattr(sink, "size_scope", None) or id(sink)
        if scope in sizes:
            continue
        try:
            sizes[scope] = int(size())
        except Exception:
            log.debug("could not read the dead-letter queue size", exc_info=True)
    return [_otel.Observation(sum(sizes.values()))] if sizes else []


def _observe_cleaner(options: CallbackOptions) -> Sequence[Observation]:
    """The oldest last pass over the stores this process reports for: the gauge exists to
    show a cleaner that stopped, so the worst one is the one to see."""
    assert _otel is not None
    ages = []
    for jobbers in _reporting():
        try:
            age = jobbers.store.last_pass_age_ms()
        except Exception:
            log.debug("could not read the cleaner's last pass", exc_info=True)
            continue
        if age is not None:
            ages.append(max(0.0, age / 1000.0))
    return [_otel.Observation(max(ages))] if ages else []
