"""The per-minute series' rules (core/series.py) and the in-memory fake's writes
(testing/series.py): bucket arithmetic, downsampling, range bounds, the name bound and cap,
and the reads of ``Jobbers.series`` over the fake. No network."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobbers_celery.core.series import (
    DAY_MS,
    HOUR_MS,
    MAX_NAME,
    MAX_POINTS,
    MINUTE_MS,
    OTHER,
    STEPS,
    MinuteCounts,
    SeriesRangeError,
    SeriesWindow,
    bound_name,
    downsample,
    merge,
    parse_span,
    step_for,
    window,
)
from jobbers_celery.core.states import TaskState
from jobbers_celery.telemetry.series import Series
from jobbers_celery.testing import InMemoryStore

S = TaskState
NOW = 1_780_000_000_000 + 12_345  # a Redis-clock time in ms, not on a minute boundary
LIB = Path(__file__).resolve().parents[2] / "jobbers_celery" / "store" / "lua" / "_lib.lua"


# ------------------------------------------------------------------ values and buckets
def test_minute_counts_parse_and_add() -> None:
    a = MinuteCounts.parse("2 30 2 500 1 1 0")
    assert a == MinuteCounts(2, 30, 2, 500, 1, 1, 0)
    assert a + a == MinuteCounts(4, 60, 4, 1000, 2, 2, 0)
    assert MinuteCounts.parse("1 x 3") == MinuteCounts(1, 0, 3)  # unreadable counts as 0
    assert MinuteCounts.parse("1 2 3 4 5 6 7 8 9") == MinuteCounts(1, 2, 3, 4, 5, 6, 7)
    assert MinuteCounts.parse("-5 1e3") == MinuteCounts(0, 1000)


def test_merge_sums_shards_and_skips_non_minute_fields() -> None:
    merged = merge([(10, {"0": "1 0 1 10 1 0 0", "59": "1 0 0 0 0 0 0", "x": "9", "60": "9"}),
                    (10, {"0": "1 0 1 20 0 1 0"})])
    assert merged == {600: MinuteCounts(2, 0, 2, 30, 1, 1, 0), 659: MinuteCounts(1)}


def test_downsample_sums_minutes_into_steps() -> None:
    win = window(NOW - 30 * MINUTE_MS, NOW, 5, NOW, 7)
    first = win.since_ms // MINUTE_MS
    minutes = {first: MinuteCounts(completed=1, ended=1, runtime_ms=100),
               first + 4: MinuteCounts(failed=1, ended=1, runtime_ms=300),
               first + 5: MinuteCounts(completed=2, ended=2, runtime_ms=50, started=2,
                                       latency_ms=8),
               first - 1: MinuteCounts(completed=99)}  # before the window: left out
    points = downsample(minutes, win)
    assert len(points) == win.points
    assert points[0].throughput == 2
    assert points[0].failure_rate == 0.5
    assert points[0].mean_runtime_ms == 200
    assert points[1].completed == 2
    assert points[1].mean_latency_ms == 4
    assert points[2].throughput == 0
    assert points[2].failure_rate is None
    assert points[0].at == datetime.fromtimestamp(win.since_ms / 1000, tz=UTC)
    assert points[1].at - points[0].at == timedelta(minutes=5)


def test_point_json_shape() -> None:
    win = window(NOW - MINUTE_MS, NOW, 1, NOW, 7)
    (point, *_) = downsample({win.since_ms // MINUTE_MS: MinuteCounts(1, 5, 1, 7, 1, 0, 0)},
                             win)
    assert point.as_dict() == {
        "at": point.at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "minutes": 1, "throughput": 1,
        "completed": 1, "failed": 0, "retried": 0, "started": 1, "failure_rate": 0.0,
        "mean_runtime_ms": 7.0, "mean_latency_ms": 5.0}
    assert point.as_dict()["at"].endswith("Z")  # type: ignore[union-attr]


# ------------------------------------------------------------------ ranges
def test_window_defaults_and_alignment() -> None:
    win = window(NOW - HOUR_MS, NOW, None, NOW, 7)
    assert win.step == 1
    assert win.since_ms % MINUTE_MS == 0
    assert win.until_ms % MINUTE_MS == 0
    assert win.until_ms > NOW  # the current minute is included
    assert window(NOW - DAY_MS, NOW, None, NOW, 7).step == 5
    assert window(NOW - 7 * DAY_MS, NOW, None, NOW, 7).step == 60
    assert step_for(6 * HOUR_MS) == 1
    assert step_for(2 * DAY_MS) == 5


@pytest.mark.parametrize(("since", "until", "step", "why"), [
    (NOW, NOW - 1, None, "before until"),
    (NOW - 9 * DAY_MS, NOW - 8 * DAY_MS, None, "days kept"),
    (NOW + HOUR_MS, NOW + 2 * HOUR_MS, None, "future"),
    (NOW - HOUR_MS, NOW, 7, "step must be"),
    (NOW - 7 * DAY_MS, NOW, 1, "at most"),
])
def test_window_refuses(since: int, until: int, step: int | None, why: str) -> None:
    with pytest.raises(SeriesRangeError, match=why):
        window(since, until, step, NOW, 7)


def test_window_clips_to_what_is_kept() -> None:
    win = window(NOW - 30 * DAY_MS, NOW, 60, NOW, 7)
    assert win.since_ms >= NOW - 7 * DAY_MS - HOUR_MS
    assert win.points <= 7 * 24 + 2


@given(since=st.integers(-10 * DAY_MS, DAY_MS), span=st.integers(1, 10 * DAY_MS),
       step=st.sampled_from((None, *STEPS)), days=st.sampled_from((0.5, 1, 7, 30)))
def test_window_property(since: int, span: int, step: int | None, days: float) -> None:
    """Any range is refused with SeriesRangeError or gives an aligned, bounded window that
    covers what it asked for within what is kept, and hours that cover its minutes."""
    since_ms, until_ms = NOW + since, NOW + since + span
    try:
        win = window(since_ms, until_ms, step, NOW, days)
    except SeriesRangeError:
        return
    step_ms = win.step * MINUTE_MS
    assert win.since_ms % step_ms == 0
    assert win.until_ms % step_ms == 0
    assert 0 < win.points <= MAX_POINTS
    assert win.since_ms <= max(since_ms, NOW - int(days * DAY_MS))
    assert win.until_ms >= min(until_ms, NOW - NOW % MINUTE_MS + MINUTE_MS)
    hours = win.hours()
    assert hours[0] * HOUR_MS <= win.since_ms
    assert (hours[-1] + 1) * HOUR_MS >= win.until_ms
    assert len(downsample({}, win)) == win.points


@given(st.dictionaries(st.integers(0, 3000), st.integers(0, 1000), max_size=60))
def test_downsample_keeps_every_count_inside_the_window(raw: dict[int, int]) -> None:
    win = SeriesWindow(0, 3000 * MINUTE_MS, 15)
    points = downsample({m: MinuteCounts(completed=n) for m, n in raw.items()}, win)
    assert sum(p.completed for p in points) == sum(n for m, n in raw.items() if m < 3000)


def test_parse_span() -> None:
    assert parse_span("90m") == 90 * MINUTE_MS
    assert parse_span("24h") == DAY_MS
    assert parse_span(" 7d ") == 7 * DAY_MS
    assert parse_span("15") == 15 * MINUTE_MS
    for bad in ("", "0h", "1w", "-1h", "1.5h", "9" * 40):
        with pytest.raises(SeriesRangeError):
            parse_span(bad)


@given(st.text(max_size=400))
def test_parse_span_never_raises_anything_else(text: str) -> None:
    with contextlib.suppress(SeriesRangeError):
        assert parse_span(text) > 0


# ------------------------------------------------------------------ names
def test_bound_name_matches_the_script() -> None:
    assert bound_name("proj.add") == "proj.add"
    assert bound_name("a" * 300) == "a" * MAX_NAME
    cut = bound_name("é" * 150)  # a cut after a multibyte lead drops that last character
    assert cut == "é" * 99
    assert len(cut.encode()) <= MAX_NAME
    lib = LIB.read_text()
    assert f"local SERIES_LEN = {MAX_NAME}" in lib
    assert f"local SERIES_OTHER = '{OTHER}'" in lib


@given(st.text(max_size=300))
def test_bound_name_is_short_valid_text(name: str) -> None:
    out = bound_name(name)
    raw = out.encode("utf-8", "surrogatepass")
    assert len(raw) <= MAX_NAME
    assert name.encode("utf-8", "surrogatepass").startswith(raw) or out != name


# ------------------------------------------------------------------ the fake's writes
def _run(store: InMemoryStore, task_id: str, to: TaskState, name: str = "proj.add",
         queue: str = "celery", run_s: float = 2.0, wait_s: float = 1.0) -> None:
    assert store.submit(task_id, sources=(S.UNSUBMITTED,), reason="published", name=name,
                        create={"name": name, "queue": queue, "ver": "1"}).applied
    store.advance(wait_s)
    assert store.start(task_id, name=name, worker="w1", wid="w1:1", heartbeat_ms=None,
                       cap=None, lease_cap_ms=60_000, defer_ms=1000, fields={}).applied
    store.advance(run_s)
    if to is S.COMPLETED:
        done = store.complete(task_id, 1, name=name, worker="w1", wid="w1:1", fields={},
                              delete=(), write_result=None)
    else:
        done = store.end(task_id, to, fence=1, wid="w1:1", name=name, worker="w1",
                         reason="boom")
    assert done.applied


def test_fake_counts_a_task_run_by_name_queue_and_total() -> None:
    store = InMemoryStore()
    _run(store, "a", S.COMPLETED)
    _run(store, "b", S.FAILED, run_s=4.0)
    _run(store, "c", S.COMPLETED, name="proj.other", queue="slow")
    series = Series(store, 7, 200)
    total = sum((p.counts for p in series.read(name="proj.add").points), MinuteCounts())
    assert (total.completed, total.failed, total.started, total.ended) == (1, 1, 2, 2)
    # the fake's clock is the real one moved forward: a few ms may pass besides
    assert 6000 <= total.runtime_ms < 6500
    assert 2000 <= total.latency_ms < 2500
    everything = sum((p.counts for p in series.read().points), MinuteCounts())
    assert (everything.completed, everything.failed) == (2, 1)
    slow = sum((p.counts for p in series.read(queue="slow").points), MinuteCounts())
    assert slow.completed == 1
    assert slow.failed == 0
    assert series.names() == (["proj.add", "proj.other"], ["celery", "slow"])


def test_fake_counts_retries_drops_and_stalls() -> None:
    store = InMemoryStore()
    _run(store, "r", S.SCHEDULED)  # an expected exception: retried later
    assert store.submit("d", sources=(S.UNSUBMITTED,), reason="published", name="proj.add",
                        create={"name": "proj.add", "queue": "celery"}).applied
    assert store.unstarted("d", S.DROPPED, reason="version").applied  # failed, never ran
    total = sum((p.counts for p in Series(store, 7, 200).read().points), MinuteCounts())
    assert (total.retried, total.failed, total.ended, total.completed) == (1, 1, 1, 0)


def test_fake_caps_the_names_a_day() -> None:
    store = InMemoryStore()
    store.series_configure(7, 2)
    for i in range(4):
        _run(store, f"t{i}", S.COMPLETED, name=f"proj.n{i}")
    names, _ = Series(store, 7, 2).names()
    assert names == ["proj.n0", "proj.n1", OTHER]
    other = sum((p.counts for p in Series(store, 7, 2).read(name=OTHER).points),
                MinuteCounts())
    assert other.completed == 2


def test_read_refuses_name_and_queue_together_and_naive_times() -> None:
    series = Series(InMemoryStore(), 7, 200)
    with pytest.raises(SeriesRangeError):
        series.read(name="a", queue="b")
    with pytest.raises(SeriesRangeError, match="zone"):
        series.read(since=datetime(2026, 1, 1))


def test_configure_writes_at_most_every_few_minutes() -> None:
    store = InMemoryStore()
    series = Series(store, 3, 50)
    assert series.configure() is True
    assert series.configure() is False
    assert store._series_conf == (3, 50)
