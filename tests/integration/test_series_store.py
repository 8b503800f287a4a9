"""The per-minute series on a real redis-server: the steps' script writes what the
in-memory fake writes, into compact hour hashes that expire, under the task's hash tag,
with the names bounded and capped. No Celery worker (tests/integration/test_series.py runs
real ones)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from jobbers_celery.core.series import OTHER, MinuteCounts, SeriesKind
from jobbers_celery.core.states import TaskState
from jobbers_celery.store import RedisStore
from jobbers_celery.telemetry.series import Series
from jobbers_celery.testing import InMemoryStore
from tests.integration.store_helpers import create, store_factory

pytestmark = pytest.mark.redis

S = TaskState


@pytest.fixture
def make_store(redis_url: str) -> Iterator[Callable[..., RedisStore]]:
    with store_factory(redis_url) as make:
        yield make


def _total(series: Series, **which: str) -> MinuteCounts:
    return sum((p.counts for p in series.read(**which).points), MinuteCounts())


def _lifecycle(store: RedisStore | InMemoryStore) -> None:
    """Completed, failed, retried then completed, dropped unstarted, stalled, cancelled."""
    def new(task_id: str, name: str = "proj.work", queue: str = "default") -> None:
        assert store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,),
                          create={"name": name, "queue": queue, "ver": "1"},
                          reason="published", name=name).applied

    def start(task_id: str) -> None:
        assert store.step(task_id, S.STARTED, start=True, worker="w1").applied

    for task_id, end in (("c1", S.COMPLETED), ("f1", S.FAILED), ("s1", S.STALLED),
                         ("x1", S.CANCELLED)):
        new(task_id)
        start(task_id)
        assert store.step(task_id, end).applied
    new("r1", queue="slow")
    start("r1")
    assert store.step("r1", S.SCHEDULED, delay_ms=0).applied
    assert store.step("r1", S.SUBMITTED).applied
    start("r1")
    assert store.step("r1", S.COMPLETED).applied
    new("d1", name="proj.other")
    assert store.step("d1", S.DROPPED, bump=True).applied


@pytest.mark.parametrize("shards", [1, 16])
def test_series_counts_each_outcome_as_the_fake_does(make_store: Callable[..., RedisStore],
                                                     shards: int) -> None:
    store = make_store(shards=shards)
    fake = InMemoryStore()
    _lifecycle(store)
    _lifecycle(fake)
    for which in ({"name": "proj.work"}, {"name": "proj.other"}, {"queue": "default"},
                  {"queue": "slow"}, {}):
        real, mem = _total(Series(store, 7, 200), **which), _total(Series(fake, 7, 200), **which)
        # the times differ (two clocks); every count agrees
        assert (real.started, real.ended, real.completed, real.failed, real.retried) == (
            mem.started, mem.ended, mem.completed, mem.failed, mem.retried), which
    work = _total(Series(store, 7, 200), name="proj.work")
    assert (work.completed, work.failed, work.retried, work.started, work.ended) == (
        2, 2, 1, 6, 6)  # failed: failed + stalled; cancelled ends an attempt, no failure
    assert _total(Series(store, 7, 200), name="proj.other").failed == 1  # dropped
    assert Series(store, 7, 200).names() == (["proj.other", "proj.work"], ["default", "slow"])


def test_hour_hashes_are_listpacks_that_expire(make_store: Callable[..., RedisStore]) -> None:
    store = make_store(shards=1)
    store.series_configure(2, 200)
    create(store, "t1")
    assert store.step("t1", S.STARTED, start=True, worker="w1").applied
    assert store.step("t1", S.COMPLETED).applied
    hour = store.now_ms() // 3_600_000
    keys = store.shards.keys[0]
    for key in (keys.series("n", hour, "proj.work"), keys.series("q", hour, "default")):
        assert store.client.object("encoding", key) == "listpack"
        ttl = store.client.ttl(key)
        assert 2 * 86400 <= ttl <= 2 * 86400 + 3600, key


def test_long_names_are_cut_and_names_past_the_cap_count_as_other(
        make_store: Callable[..., RedisStore]) -> None:
    store = make_store(shards=1)
    store.series_configure(7, 3)
    long = "é" * 150 + "\x1b[2J"
    for i, name in enumerate((long, "n1", "n2", "n3", "n4")):
        create(store, f"t{i}", name=name)
        assert store.step(f"t{i}", S.STARTED, start=True, worker="w1").applied
        assert store.step(f"t{i}", S.COMPLETED).applied
    names, _ = Series(store, 7, 3).names()
    assert names == sorted(["é" * 99, "n1", "n2", OTHER])
    assert _total(Series(store, 7, 3), name=OTHER).completed == 2
    assert _total(Series(store, 7, 3), name=long).completed == 1  # the read cuts it alike
    assert store.series_hours(SeriesKind.NAME, ["n3"], [store.now_ms() // 3_600_000]) == []


def test_a_fraction_of_a_day_expires_in_whole_seconds(
        make_store: Callable[..., RedisStore]) -> None:
    """EXPIRE takes whole seconds: days of 0.01 (864 s) must not fail the step."""
    store = make_store(shards=1)
    store.series_configure(0.01, 200)
    create(store, "t1")
    assert store.step("t1", S.STARTED, start=True, worker="w1").applied
    assert store.step("t1", S.COMPLETED).applied
    key = store.shards.keys[0].series("n", store.now_ms() // 3_600_000, "proj.work")
    assert 0 < store.client.ttl(key) <= 864 + 3600
