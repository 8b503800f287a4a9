"""The emptied-store watch (:mod:`jobbers_celery.lifecycle.emptied`) without Redis: an epoch
that changes under a process is reported once (ERROR line, ``store_emptied`` counter, one
``store_emptied`` alert), by the one process that takes the lease; the first epoch a
process meets, or an unchanged one, says nothing."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from jobbers_celery.alerts.events import AlertEvent, AlertKind
from jobbers_celery.lifecycle.emptied import PROBE, EmptiedWatch
from jobbers_celery.telemetry import metrics
from tests.unit.test_metrics import collect


@pytest.fixture
def otel() -> Iterator[InMemoryMetricReader]:
    """A private meter provider (the global one stays untouched)."""
    found = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[found]))
    yield found
    metrics.set_meter_provider(None)


class _Store:
    """One Redis, as the watch sees it: an epoch made on first use, leases."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.made = 0
        self.leases: set[str] = set()

    def epoch(self, task_id: str, max_age: float = 0.0) -> str:
        assert task_id == PROBE
        if self.current is None:
            self.made += 1
            self.current = f"epoch-{self.made}"
        return self.current

    def try_lock(self, name: str, ttl_ms: int) -> bool:
        if name in self.leases:
            return False
        self.leases.add(name)
        return True

    def empty(self) -> None:
        """Redis restarted without persistence: every key gone."""
        self.current = None
        self.leases.clear()


def test_an_emptied_store_is_reported_once_by_one_process(
        otel: InMemoryMetricReader, caplog: pytest.LogCaptureFixture) -> None:
    store, sent = _Store(), []
    watches = [EmptiedWatch(store, sent.append, "jobbers", f"w{n}@host") for n in range(3)]
    with caplog.at_level(logging.ERROR, logger="jobbers.store"):
        for _ in range(3):
            assert not any(w.check() for w in watches)  # first use, then unchanged
        store.empty()
        reported = [w.check() for w in watches]
        for _ in range(3):  # later checks say nothing more
            assert not any(w.check() for w in watches)
    assert reported == [True, False, False]
    assert [w.reported for w in watches] == [1, 0, 0]
    (line,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert line.getMessage().startswith("jobbers store emptied: jobbers' Redis store (prefix "
                                        "'jobbers') lost its data: its dataset id changed "
                                        "from epoch-1 to epoch-2 (noticed by w0@host)")
    (alert,) = sent
    assert isinstance(alert, AlertEvent)
    assert (alert.kind, alert.key) == (AlertKind.STORE_EMPTIED, "jobbers")
    assert alert.title == "jobbers' Redis store came back empty"
    assert collect(otel)["store_emptied"] == [({"prefix": "jobbers"}, 1)]


def test_a_process_that_first_meets_the_emptied_store_says_nothing() -> None:
    store, sent = _Store(), []
    EmptiedWatch(store, sent.append, "jobbers").check()
    store.empty()
    late = EmptiedWatch(store, sent.append, "jobbers")
    assert not late.check()
    assert not late.check()
    assert sent == []


class _Cluster(_Store):
    """Shards over several nodes: one node loses its data (its shards) alone."""

    def __init__(self, shards: int = 4) -> None:
        super().__init__()
        self.shards: list[str | None] = [None] * shards
        self.reads = 0

    def epochs(self) -> list[str]:
        self.reads += 1  # one pipeline
        for i, epoch in enumerate(self.shards):
            if epoch is None:
                self.made += 1
                self.shards[i] = f"epoch-{self.made}"
        return [str(e) for e in self.shards]

    def epoch(self, task_id: str, max_age: float = 0.0) -> str:
        raise AssertionError("every shard is read in one call")


def test_a_node_that_lost_its_shards_alone_is_reported_once(caplog):
    store, sent = _Cluster(shards=4), []
    watches = [EmptiedWatch(store, sent.append, "jobbers", f"w{n}@host") for n in range(2)]
    with caplog.at_level(logging.ERROR, logger="jobbers.store"):
        assert not any(w.check() for w in watches)
        store.shards[1] = store.shards[3] = None  # the node of shards 1 and 3 came back empty
        assert [w.check() for w in watches] == [True, False]
        assert not any(w.check() for w in watches)
    assert store.reads == 6  # one read of every shard per check
    (alert,) = sent
    assert ("the dataset id of 2 of its 4 shards changed: shard 1 (epoch-2 to epoch-5), "
            "3 (epoch-4 to epoch-6) (noticed by w0@host)") in alert.text
