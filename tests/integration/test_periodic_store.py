"""The beat watch's records (periodic.lua) on a real Redis, and the in-memory store alike:
each verdict counted once, the runs bounded, the set of schedules bounded, names with any
character kept as they are."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobbers_celery.core import periodic as rules
from jobbers_celery.store import RedisStore
from jobbers_celery.store.parts import PeriodicStore
from jobbers_celery.store.periodic import MAX_EVENT_AGE_MS
from jobbers_celery.testing import InMemoryStore
from tests.integration.store_helpers import store_factory

pytestmark = pytest.mark.redis

FIELDS = {"task": "proj.add", "desc": "<freq: 1.00 second>", "source": "beat",
          "period": "1000"}


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest) -> Iterator[PeriodicStore]:
    if request.param == "memory":
        yield InMemoryStore()
        return
    url = request.getfixturevalue("redis_url")
    with store_factory(url) as make:
        redis_store: RedisStore = make(shards=1)
        yield redis_store


def test_a_publish_then_a_late_start_then_its_end(store):
    assert store.periodic_learn("tick", FIELDS, 1000)
    assert store.periodic_publish("tick", "r1", "proj.add", -5000, 1000, 10, 1000)
    assert store.periodic_start("tick", "r1", "proj.add", 10, 1000, 60_000) == (True, [])
    assert store.periodic_start("tick", "r1", "proj.add", 10, 1000, 60_000) == (False, [])
    store.periodic_end("tick", "r1", "SUCCESS")
    (s,) = store.periodic_schedules(5)
    assert (s.runs_total, s.late, s.overlapping, s.missed) == (1, 1, 0, 0)
    (run,) = s.runs
    assert run.late
    assert run.state == "SUCCESS"
    assert run.slot_at is not None
    assert run.published_at is not None
    assert 4500 < run.published_at - run.slot_at < 5500
    assert run.started_at is not None
    assert run.ended_at is not None
    assert s.last_state == "SUCCESS"
    assert s.next_at is not None


def test_a_run_a_worker_started_before_beat_recorded_its_publish(store):
    store.periodic_learn("tick", FIELDS, 1000)
    assert store.periodic_start("tick", "r1", "proj.add", 10, 1000, 60_000) == (False, [])
    assert store.periodic_publish("tick", "r1", "proj.add", -5000, 1000, 10, 1000) == 2
    assert store.periodic_publish("tick", "r2", "proj.add", 0, 1000, 10, 1000) == 1
    assert store.periodic_start("tick", "r2", "proj.add", 10, 1000, 60_000) == (False, [])
    assert store.periodic_end("tick", "r1", "SUCCESS") == ["r2"]  # r2 started before it
    assert store.periodic_publish("tick", "r2", "proj.add", 0, 1000, 10, 1000) == 1
    (s,) = store.periodic_schedules(5)
    assert (s.runs_total, s.late, s.overlapping) == (2, 1, 1)
    first = next(r for r in s.runs if r.id == "r1")
    assert first.started_at is not None
    assert first.published_at is not None
    assert first.late
    assert first.state == "SUCCESS"


def test_overlap_and_a_run_of_a_beat_without_jobbers(store):
    store.periodic_learn("tick", FIELDS, 1000)
    assert store.periodic_start("tick", "a", "proj.add", 10, 1000, 60_000) == (False, [])
    assert store.periodic_start("tick", "b", "proj.add", 10, 1000, 60_000) == (False, [])
    assert store.periodic_end("tick", "a", "SUCCESS") == ["b"]  # b started while a ran
    assert store.periodic_end("tick", "b", "SUCCESS") == []
    assert store.periodic_start("tick", "c", "proj.add", 10, 1000, 60_000) == (False, [])
    (s,) = store.periodic_schedules(5)
    assert s.overlapping == 1
    assert s.runs_total == 3
    assert [r.id for r in s.runs if r.overlapping] == ["b"]


def test_a_running_run_older_than_stale_no_longer_overlaps(store):
    store.periodic_learn("tick", FIELDS, 1000)
    store.periodic_start("tick", "a", "proj.add", 10, 1000, 60_000)
    assert store.periodic_start("tick", "b", "proj.add", 10, 1000, 0) == (False, [])
    assert store.periodic_end("tick", "a", "SUCCESS") == []


def test_times_are_the_events_not_the_sends(store):
    """A start and an end sent late (a writer waiting out an outage) are recorded at the
    time they happened: a run started on its slot is not late, and a run whose end was
    sent after the next run's start did not overlap it. Ages are bounded."""
    store.periodic_learn("tick", FIELDS, 1000)
    store.periodic_publish("tick", "a", "proj.add", -30_000, 1000, 10, 1000)
    # started on its slot, 30 s ago, sent now: not late (tolerance 1 s)
    assert store.periodic_start("tick", "a", "proj.add", 10, 1000, 600_000,
                                age_ms=29_800) == (False, [])
    store.periodic_publish("tick", "b", "proj.add", -1000, 1000, 10, 1000)
    # b started 900 ms ago; a's end, 20 s ago, reaches the store after it
    assert store.periodic_start("tick", "b", "proj.add", 10, 1000, 600_000,
                                age_ms=900) == (False, [])
    assert store.periodic_end("tick", "a", "SUCCESS", age_ms=20_000) == []
    assert store.periodic_end("tick", "b", "SUCCESS") == []
    (s,) = store.periodic_schedules(5)
    assert (s.late, s.overlapping) == (0, 0)
    runs = {r.id: r for r in s.runs}
    assert runs["a"].started_at is not None
    assert runs["a"].slot_at is not None
    assert abs(runs["a"].started_at - runs["a"].slot_at) < 1000
    assert runs["a"].ended_at is not None
    assert runs["b"].started_at is not None
    assert runs["a"].ended_at < runs["b"].started_at
    # an age past the bound is the bound; a negative one is 0
    now = store.now_ms()
    store.periodic_start("tick", "c", "proj.add", 10, 1000, 600_000, age_ms=10**12)
    store.periodic_end("tick", "c", "SUCCESS", age_ms=-10**12)
    c = next(r for r in store.periodic_schedules(5)[0].runs if r.id == "c")
    assert c.started_at is not None
    assert c.ended_at is not None
    assert now - MAX_EVENT_AGE_MS - 50 <= c.started_at <= now - MAX_EVENT_AGE_MS + 1000
    assert now - 50 <= c.ended_at <= now + 1000


def test_estimated_times_keep_their_order(store):
    """Each time is estimated from another process's clock and send (a slot from beat's
    offset, a start or end from a worker's age): where two estimates cross, a run still
    reads slot <= publish <= start <= end (seen with a real beat: an end 2 ms before its
    start, a slot 3 ms after the publish)."""
    store.periodic_learn("tick", FIELDS, 1000)
    # an end whose age puts it before its start (ages measured in another process)
    store.periodic_publish("tick", "a", "proj.add", 0, 1000, 10, 1000)
    store.periodic_start("tick", "a", "proj.add", 10, 1000, 600_000, age_ms=0)
    store.periodic_end("tick", "a", "SUCCESS", age_ms=5_000)
    # a start recorded after the publish but estimated before it, before its slot too
    store.periodic_publish("tick", "b", "proj.add", 0, 1000, 10, 1000)
    store.periodic_start("tick", "b", "proj.add", 10, 1000, 600_000, age_ms=5_000)
    # a slot placed after the start a worker recorded first
    store.periodic_start("tick", "c", "proj.add", 10, 1000, 600_000, age_ms=5_000)
    store.periodic_publish("tick", "c", "proj.add", 0, 1000, 10, 1000)
    runs = {r.id: r for r in store.periodic_schedules(5)[0].runs}
    for rid, run in runs.items():
        times = [t for t in (run.slot_at, run.published_at, run.started_at, run.ended_at)
                 if t is not None]
        assert times == sorted(times), (rid, run)
        assert not run.late, (rid, run)
    assert runs["a"].ended_at == runs["a"].started_at
    assert runs["b"].slot_at == runs["b"].published_at == runs["b"].started_at
    assert runs["c"].slot_at == runs["c"].published_at == runs["c"].started_at


def test_missed_slots_compare_and_set_and_the_late_scan(store):
    store.periodic_learn("tick", FIELDS, -3000)
    h = store.periodic_state("tick")
    assert h["next_at"]
    assert "judged_to" not in h
    now = store.now_ms()
    slots = rules.missed_slots(int(h["next_at"]), 1000, 0, now, 0)
    assert len(slots) in (3, 4)
    assert store.periodic_missed("tick", "", slots, 10) == len(slots)
    assert store.periodic_missed("tick", "", slots, 10) == 0  # another judge was first
    assert store.periodic_state("tick")["judged_to"] == str(slots[-1])
    store.periodic_publish("tick", "r1", "proj.add", -2000, 1000, 10, 1000)
    assert store.periodic_late("tick", 1000) == ["r1"]
    assert store.periodic_late("tick", 1000) == []
    assert store.periodic_start("tick", "r1", "proj.add", 10, 1000, 60_000) == (False, [])
    (s,) = store.periodic_schedules(10)
    assert s.missed == len(slots)
    assert s.late == 1
    assert {r.state for r in s.runs} == {"missed", "started"}


def test_runs_are_trimmed_and_removal_stops_the_slots(store):
    store.periodic_learn("tick", FIELDS, 1000)
    for n in range(8):
        store.periodic_publish("tick", f"r{n}", "proj.add", -n, 1000, 3, 1000)
    (s,) = store.periodic_schedules(10)
    assert len(s.runs) == 3
    assert s.runs_total == 8
    assert store.periodic_remove("tick")
    assert not store.periodic_remove("tick")
    h = store.periodic_state("tick")
    assert "removed_at" in h
    assert "next_at" not in h
    assert store.periodic_missed("tick", h.get("judged_to", ""), [1, 2], 3) == 0
    store.periodic_learn("tick", FIELDS, 1000)  # beat lists it again
    assert "removed_at" not in store.periodic_state("tick")


def test_names_with_any_character_and_the_bound_on_schedules(store, monkeypatch):
    name = "weird {name}: \u00e9\n<b>" + "x" * 50
    assert store.periodic_learn(name, FIELDS, None)
    assert store.periodic_names() == [name]
    assert store.periodic_schedules(1)[0].name == name
    monkeypatch.setattr("jobbers_celery.testing.periodic.MAX_SCHEDULES", 2)
    monkeypatch.setattr("jobbers_celery.store.periodic.MAX_SCHEDULES", 2)
    assert store.periodic_learn("second", FIELDS, None)
    assert not store.periodic_learn("third", FIELDS, None)
    assert not store.periodic_publish("third", "r", "t", 0, None, 3, 1000)
    assert store.periodic_start("third", "r", "t", 3, 1000, 1000) == (False, [])
    assert store.periodic_learn(name, FIELDS, None)  # one watched already: refreshed
    assert len(store.periodic_names()) == 2
