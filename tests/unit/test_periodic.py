"""The beat watch without Redis: the slot arithmetic (property tests), the watch's verdicts
on the in-memory store (each counted once, as a metric and an alert), what it learns of
Celery's own schedule types, and the beat scheduler hook on Celery's ``Scheduler``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from celery.beat import Scheduler
from celery.schedules import crontab, schedule
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from jobbers_celery import JobbersConfig
from jobbers_celery.alerts.events import AlertEvent, AlertKind
from jobbers_celery.core.periodic import MAX_NAME, MISSED_PER_PASS, bounded, missed_slots
from jobbers_celery.lifecycle.periodic import PeriodicWatch, ScheduleInfo
from jobbers_celery.store.periodic import MAX_EVENT_AGE_MS
from jobbers_celery.telemetry import metrics
from jobbers_celery.testing import InMemoryStore
from jobbers_celery.worker import periodic as glue

ms = st.integers(min_value=0, max_value=10**13)


@given(next_at=st.integers(1, 10**13), period=st.integers(-5, 10**8), judged=ms, now=ms,
       tol=st.integers(0, 10**7), limit=st.integers(0, 300))
def test_missed_slots_are_the_passed_slots_after_what_was_judged(next_at, period, judged,
                                                                 now, tol, limit):
    got = missed_slots(next_at, period, judged, now, tol, limit)
    assert len(got) <= limit
    assert got == sorted(set(got))
    for slot in got:
        assert judged < slot <= now - tol
        assert slot >= next_at
        if period > 0:
            assert (slot - next_at) % period == 0
    if period <= 0:
        assert len(got) <= 1
    elif got and len(got) < limit:
        # none left out: the next slot is either still within tolerance or absent
        assert got[-1] + period > now - tol
    if got and period > 0:  # none skipped before the first
        assert got[0] - period <= max(judged, next_at - period)


@given(next_at=st.integers(1, 10**12), period=st.integers(1, 10**6),
       periods=st.integers(0, 2000), tol=st.integers(0, 10**5))
def test_judging_in_steps_counts_each_slot_once(next_at, period, periods, tol):
    now = next_at + periods * period + tol  # at most ~2,000 slots passed
    whole = missed_slots(next_at, period, 0, now, tol, limit=5000)
    judged, parts = 0, []
    for step in (next_at + (now - next_at) // 3, next_at + (now - next_at) // 2, now):
        got = missed_slots(next_at, period, judged, step, tol, limit=5000)
        parts += got
        judged = got[-1] if got else judged
    assert parts == whole


def test_a_long_outage_is_counted_a_pass_at_a_time():
    got = missed_slots(1000, 1000, 0, 10**9, 0)
    assert len(got) == MISSED_PER_PASS
    rest = missed_slots(1000, 1000, got[-1], 10**9, 0)
    assert rest[0] == got[-1] + 1000


@given(st.text())
def test_names_are_bounded(text):
    assert len(bounded(text)) <= MAX_NAME
    assert bounded(text) == text[:MAX_NAME]


# ---------------------------------------------------------------------- the watch
@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    saved = metrics._sources
    metrics._sources = tuple
    found = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[found]))
    yield found
    metrics.set_meter_provider(None)
    metrics._sources = saved


def counted(reader: InMemoryMetricReader) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    data = reader.get_metrics_data()
    for resource in getattr(data, "resource_metrics", None) or ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name.startswith("periodic_runs_"):
                    for point in metric.data.data_points:
                        out[(metric.name, point.attributes["schedule"])] = point.value
    return out


class Watched:
    def __init__(self, tolerance: float = 1.0) -> None:
        self.store = InMemoryStore()
        self.alerts: list[AlertEvent] = []
        config = JobbersConfig(redis_url="redis://x", periodic_tolerance=tolerance,
                               periodic_keep_runs=5, periodic_check_interval=0.1)
        self.watch = PeriodicWatch(self.store, config, emit=self.alerts.append)

    def one(self, name: str = "tick") -> Any:
        (found,) = [s for s in self.watch.schedules(runs=10) if s.name == name]
        return found


def every(seconds: float, next_in: float | None = 1.0, name: str = "tick") -> ScheduleInfo:
    return ScheduleInfo.of(name, "proj.add", f"<freq: {seconds}>", seconds * 1000,
                           None if next_in is None else next_in * 1000)


def test_a_run_on_time_is_neither_late_nor_overlapping(reader):
    w = Watched()
    w.watch.learn([every(10)], "beat", beat="beat@host")
    w.watch.published(every(10, next_in=10), "r1", slot_in_ms=0)
    w.watch.started("tick", "r1", "proj.add")
    w.watch.ended("tick", "r1", "SUCCESS")
    s = w.one()
    assert (s.missed, s.late, s.overlapping, s.runs_total) == (0, 0, 0, 1)
    assert s.source == "beat"
    assert s.task == "proj.add"
    assert s.last_state == "SUCCESS"
    assert s.runs[0].state == "SUCCESS"
    assert s.runs[0].ended_at is not None
    assert w.alerts == []
    assert counted(reader) == {}


def test_a_run_started_past_the_tolerance_is_late_once(reader):
    w = Watched(tolerance=1.0)
    w.watch.learn([every(10)], "beat")
    w.watch.published(every(10), "r1", slot_in_ms=-5000)  # beat sent it 5 s past its slot
    w.watch.started("tick", "r1", "proj.add")
    w.watch.started("tick", "r1", "proj.add")  # a redelivery: not again
    assert w.one().late == 1
    assert w.one().runs[0].late
    assert [(a.kind, a.key) for a in w.alerts] == [(AlertKind.PERIODIC_LATE, "tick")]
    assert counted(reader) == {("periodic_runs_late", "tick"): 1}


def test_a_run_not_started_is_flagged_late_by_the_judge_then_not_again_at_its_start(reader):
    w = Watched(tolerance=1.0)
    w.watch.learn([every(10, next_in=10)], "beat")
    w.watch.published(every(10, next_in=10), "r1", slot_in_ms=0)
    assert w.watch.judge().late == {}
    w.store.advance(2)
    assert w.watch.judge().late == {"tick": ["r1"]}
    assert w.watch.judge().late == {}
    w.watch.started("tick", "r1", "proj.add")
    assert w.one().late == 1
    assert [a.kind for a in w.alerts] == [AlertKind.PERIODIC_LATE]
    assert counted(reader) == {("periodic_runs_late", "tick"): 1}


def test_a_run_started_while_the_last_runs_overlaps(reader):
    w = Watched()
    w.watch.learn([every(1)], "beat")
    for rid in ("r1", "r2"):
        w.watch.published(every(1), rid, slot_in_ms=0)
        w.watch.started("tick", rid, "proj.add")
    w.watch.ended("tick", "r1", "SUCCESS")
    w.watch.ended("tick", "r2", "SUCCESS")
    w.watch.published(every(1), "r3", slot_in_ms=0)
    w.watch.started("tick", "r3", "proj.add")  # both ended: not overlapping
    s = w.one()
    assert s.overlapping == 1
    assert [r.id for r in s.runs if r.overlapping] == ["r2"]
    assert [(a.kind, a.key) for a in w.alerts] == [(AlertKind.PERIODIC_OVERLAP, "tick")]
    assert counted(reader) == {("periodic_runs_overlapping", "tick"): 1}


def test_slots_beat_did_not_publish_are_missed_once_each(reader):
    w = Watched(tolerance=1.0)
    w.watch.learn([every(2, next_in=2)], "beat")
    w.store.advance(2.5)
    assert w.watch.judge().missed == {}  # within the tolerance
    w.store.advance(1)  # 3.5 s: the slot at 2 s is missed, the one at 4 s not yet
    assert w.watch.judge().missed == {"tick": 1}
    assert w.watch.judge().missed == {}
    w.store.advance(4)  # 7.5 s: the slots at 4 s and 6 s
    assert w.watch.judge().missed == {"tick": 2}
    s = w.one()
    assert s.missed == 3
    assert s.last_state == "missed"
    assert [r.state for r in s.runs] == ["missed"] * 3
    assert [a.kind for a in w.alerts] == [AlertKind.PERIODIC_MISSED] * 2
    assert counted(reader) == {("periodic_runs_missed", "tick"): 3}


def test_two_judges_at_once_count_a_slot_once():
    w = Watched(tolerance=0)
    w.watch.learn([every(1, next_in=1)], "beat")
    w.store.advance(1.5)
    judged = w.store.periodic_state("tick").get("judged_to", "")
    assert w.store.periodic_missed("tick", judged, [1], 5) == 1
    assert w.store.periodic_missed("tick", judged, [1], 5) == 0  # compare-and-set lost


def test_a_schedule_beat_no_longer_lists_is_removed_and_not_judged():
    w = Watched(tolerance=0)
    w.watch.learn([every(1, name="a"), every(1, name="b")], "beat")
    w.watch.learn([every(1, name="a", next_in=None)], "beat", complete=True)
    w.store.advance(5)
    assert set(w.watch.judge().missed) == {"a"}
    assert w.one("b").removed_at is not None
    assert w.one("a").removed_at is None


def test_runs_kept_are_bounded():
    w = Watched()
    w.watch.learn([every(1)], "beat")
    for n in range(12):
        w.watch.published(every(1), f"r{n}", slot_in_ms=0)
        w.store.advance(0.01)
    s = w.one()
    assert [r.id for r in s.runs] == ["r11", "r10", "r9", "r8", "r7"]
    assert s.runs_total == 12


def test_the_judge_runs_once_per_check_interval_across_processes():
    w = Watched()
    other = PeriodicWatch(w.store, w.watch.config)
    assert w.watch.maybe_judge() is not None
    assert w.watch.maybe_judge() is None  # this process: not yet
    assert other.maybe_judge() is None  # another: the lock


def test_an_alert_that_fails_never_stops_the_watch():
    w = Watched()

    def broken(event: AlertEvent) -> None:
        raise RuntimeError("down")

    w.watch.emit = broken
    w.watch.learn([every(1)], "beat")
    w.watch.published(every(1), "r1", slot_in_ms=-5000)
    w.watch.started("tick", "r1", "proj.add")
    assert w.one().late == 1


# ---------------------------------------------------------------------- Celery's side
def test_what_is_learned_of_celerys_schedule_types():
    app = Celery("t", set_as_current=False)
    entry = type("E", (), {})()
    entry.name, entry.task = "x" * 500, "proj.add"
    entry.schedule = schedule(timedelta(seconds=30), app=app)
    entry.last_run_at = entry.schedule.now() - timedelta(seconds=10)
    info = glue.info_of(entry)
    assert len(info.name) == MAX_NAME
    assert info.period_ms == pytest.approx(30_000, abs=5)
    assert info.next_in_ms == pytest.approx(20_000, abs=200)
    entry.schedule = crontab(minute="*/15", app=app)
    entry.last_run_at = entry.schedule.now()
    info = glue.info_of(entry)
    assert info.period_ms == pytest.approx(15 * 60_000, abs=1000)
    assert 0 < info.next_in_ms <= 15 * 60_000 + 1000
    entry.schedule = object()  # a type without remaining_estimate: learned, no slots
    info = glue.info_of(entry)
    assert (info.period_ms, info.next_in_ms) == (0, None)


class _Sent:
    def __init__(self, task_id: str) -> None:
        self.id = task_id


def test_the_hook_records_beats_schedule_and_each_publish_with_its_slot():
    app = Celery("t", set_as_current=False)
    # a name no module registers: beat runs a task the app knows (every app gets the shared
    # tasks, e.g. tests.integration.proj's proj.add(x, y)) by its apply_async, not send_task
    app.conf.beat_schedule = {"tick": {"task": "test_periodic.hooked", "schedule": 10.0}}
    sent: list[dict[str, Any]] = []
    scheduler = Scheduler(app, lazy=True)
    scheduler.setup_schedule()
    n = iter(range(100))

    def send_task(name: str, args: Any, kwargs: Any, producer: Any = None,
                  **options: Any) -> _Sent:
        headers: dict[str, Any] = dict(options.get("headers") or {})
        glue.on_before_publish(headers=headers)
        sent.append(headers)
        return _Sent(f"id-{next(n)}")

    scheduler.send_task = send_task  # type: ignore[method-assign]
    w = Watched(tolerance=1.0)
    glue.hook_scheduler(scheduler, w.watch, "beat@test")
    scheduler.tick()  # learns the entries: next slot in ~10 s
    s = w.one()
    assert (s.source, s.task, s.period_ms) == ("beat", "test_periodic.hooked", 10_000)
    assert s.next_at is not None
    entry = scheduler.schedule["tick"]
    entry.last_run_at = entry.last_run_at - timedelta(seconds=10)  # due now
    scheduler.apply_entry(entry)
    assert "test_periodic.hooked" not in app.tasks  # so sent by send_task, as a real beat's
    assert sent[-1][glue.HEADER] == "tick"
    s = w.one()
    assert s.runs[0].id.startswith("id-")
    assert s.late == 0
    assert s.runs[0].slot_at is not None
    assert s.runs[0].published_at is not None
    assert abs(s.runs[0].published_at - s.runs[0].slot_at) < 1000


def test_a_slot_is_placed_before_a_publish_that_took_time_and_a_start_it_let_in_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The store places a run's slot from its own clock when beat's record arrives, which is
    after the publish: the publish's time is taken off. Before, a run a worker started while
    the broker call returned had its slot after its start (seen with a real beat: slot 3 ms
    after the publish)."""
    app = Celery("t", set_as_current=False)
    app.conf.beat_schedule = {"tick": {"task": "test_periodic.hooked", "schedule": 10.0}}
    scheduler = Scheduler(app, lazy=True)
    scheduler.setup_schedule()
    w = Watched(tolerance=1.0)
    real, spent = glue.time.monotonic, [0.0]
    monkeypatch.setattr(glue.time, "monotonic", lambda: real() + spent[0])

    def send_task(name: str, args: Any, kwargs: Any, producer: Any = None,
                  **options: Any) -> _Sent:
        w.watch.started("tick", "id-0", name)  # a worker takes it before beat records it
        spent[0] += 0.25  # the broker call returns 250 ms later, on both clocks
        w.store.advance(0.25)
        return _Sent("id-0")

    scheduler.send_task = send_task  # type: ignore[method-assign]
    glue.hook_scheduler(scheduler, w.watch, "beat@test")
    scheduler.tick()
    entry = scheduler.schedule["tick"]
    entry.last_run_at = entry.last_run_at - timedelta(seconds=10)  # due now
    scheduler.apply_entry(entry)
    (run,) = w.one().runs
    assert run.slot_at is not None
    assert run.started_at is not None
    assert run.published_at is not None
    assert run.slot_at <= run.published_at <= run.started_at, run
    # the slot was due when it was published: real time between the two clock reads counts
    # too (128 ms once on a loaded CI machine); taken off twice, it would be 250 ms and more
    assert run.started_at - run.slot_at < 200, run
    assert not run.late


def test_a_message_names_its_schedule_by_header_or_by_its_config_entry():
    app = Celery("t", set_as_current=False)
    app.conf.beat_schedule = {"one": {"task": "a", "schedule": 1.0},
                              "two": {"task": "b", "schedule": 1.0},
                              "three": {"task": "b", "schedule": 2.0}}

    def task(name: str, **request: Any) -> Any:
        t = type("T", (), {})()
        t.name, t.app = name, app
        t.request = type("R", (), request)()
        return t

    assert glue.schedule_of(task("a", periodic_task_name="n" * 999)) == "n" * MAX_NAME
    assert glue.schedule_of(task("a", celery_beat_task=True)) == "one"
    assert glue.schedule_of(task("b", celery_beat_task=True)) is None  # two entries run b
    assert glue.schedule_of(task("a")) is None  # not from beat


# ---------------------------------------------------------------------- the command line
def _cli(app: Celery, *args: str) -> Any:
    from types import SimpleNamespace

    from click.testing import CliRunner

    from jobbers_celery.cli import jobbers as cli

    return CliRunner().invoke(cli, list(args), obj=SimpleNamespace(app=app))


@pytest.fixture
def watched_app() -> Celery:
    from jobbers_celery.testing import in_memory

    app = Celery("periodic_cli", broker="memory://", set_as_current=False)
    jobbers = in_memory(app)
    watch = jobbers.periodic
    tick = every(10, name="tick")
    watch.learn([tick, every(10, name="odd \x1b[2J", next_in=-30)], "beat")
    watch.published(tick, "run-1", -20_000)
    watch.started("tick", "run-1", "proj.add")
    watch.judge()
    return app


def test_the_command_lists_schedules_and_runs_escaped(watched_app):
    result = _cli(watched_app, "periodic", "--runs", "5")
    assert result.exit_code == 0, result.output
    assert "tick" in result.output
    assert "proj.add" in result.output
    assert "\x1b" not in result.output
    assert "odd \\x1b[2J" in result.output
    assert "missed" in result.output
    assert "late" in result.output


def test_the_command_json_is_the_apis_and_check_exits_1(watched_app):
    result = _cli(watched_app, "periodic", "--json")
    body = json.loads(result.output)
    assert body["count"] == 2
    tick = next(s for s in body["results"] if s["name"] == "tick")
    assert tick["late"] == 1
    assert tick["runs"][0]["id"] == "run-1"
    checked = _cli(watched_app, "periodic", "--check")
    assert checked.exit_code == 1
    assert "2 schedule(s) with missed or late runs" in checked.output
    assert _cli(watched_app, "periodic", "--runs", "-1").exit_code == 2


# ---------------------------------------------------------------------- settings, install
@pytest.mark.parametrize(("setting", "value"), [
    ("periodic_tolerance", 0), ("periodic_tolerance", float("nan")),
    ("periodic_check_interval", -1), ("periodic_keep_runs", 0),
    ("periodic_keep_runs", 1001), ("periodic_keep_runs", True), ("cleaner_queue", 3),
    ("cleaner_queue", "q" * 201),
])
def test_bad_settings_are_refused_naming_them(setting, value):
    from jobbers_celery import ConfigurationError

    with pytest.raises(ConfigurationError, match=f"jobbers_{setting}"):
        JobbersConfig.from_mapping({"jobbers_redis_url": "redis://x",
                                    f"jobbers_{setting}": value})


def test_the_cleaners_entry_goes_to_its_queue_and_sends_no_task_events():
    from jobbers_celery.testing import in_memory

    app = Celery("cleaner_queue", broker="memory://", set_as_current=False)
    app.conf.jobbers_cleaner_queue = "jobbers"
    in_memory(app)
    assert app.conf.beat_schedule["jobbers.clean"]["options"] == {"queue": "jobbers"}
    task = app.tasks["jobbers.clean"]
    assert task.send_events is False
    assert task.ignore_result is True
    plain = Celery("cleaner_default", broker="memory://", set_as_current=False)
    in_memory(plain)
    assert "options" not in plain.conf.beat_schedule["jobbers.clean"]
    assert plain.tasks["jobbers.clean"].send_events is False


def test_a_worker_learns_beat_schedule_entries_no_beat_reported():
    from types import SimpleNamespace

    from jobbers_celery.testing import in_memory

    app = Celery("config_learn", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {"every-30s": {"task": "proj.a", "schedule": 30.0},
                              "every-2m": {"task": "proj.b",
                                           "schedule": timedelta(minutes=2)},
                              "nightly": {"task": "proj.c", "schedule": crontab(hour=3)}}
    jobbers = in_memory(app)
    jobbers.periodic.learn([every(10, name="every-30s")], "beat")  # a beat reported it
    glue.on_worker_setup(instance=SimpleNamespace(app=app))
    found = {s.name: s for s in jobbers.periodic_tasks()}
    assert found["every-30s"].source == "beat"  # left as the beat reported it
    assert (found["every-2m"].source, found["every-2m"].period_ms) == ("config", 120_000)
    assert found["every-2m"].next_at is None  # no slot known without a beat
    assert found["nightly"].task == "proj.c"
    assert "jobbers.clean" in found


@given(name=st.text(min_size=1, max_size=300), desc=st.text(max_size=300))
def test_any_schedule_name_reads_on_one_escaped_line(name, desc):
    from jobbers_celery.cli import output as out
    from jobbers_celery.cli.periodic import _row

    store = InMemoryStore()
    watch = PeriodicWatch(store, JobbersConfig(redis_url="redis://x"))
    watch.learn([ScheduleInfo.of(name, "t", desc, 1000, 1000)], "beat")
    (s,) = watch.schedules()
    assert s.name == bounded(name)
    text = out.table(("SCHEDULE", "TASK", "EVERY", "LAST RUN", "NEXT", "MISSED", "LATE",
                      "OVERLAP", "LAST STATE"), [_row(s)], width=200)
    assert len(text.splitlines()) == 2  # the header and one row, whatever the name holds
    assert not any((ord(c) < 32 and c != "\n") or 0x7F <= ord(c) < 0xA0 for c in text)


def test_a_workers_scheduler_pass_judges_the_missed_slots():
    from jobbers_celery.testing import in_memory

    app = Celery("judged_by_worker", broker="memory://", set_as_current=False)
    app.conf.jobbers_periodic_tolerance = 1
    jobbers = in_memory(app)
    jobbers.periodic.learn([every(2, next_in=2)], "beat")
    jobbers.store.advance(10)  # beat stopped: the slots at 2, 4, 6 and 8 s passed
    jobbers.scheduler("w1").tick()
    assert jobbers.periodic_tasks()[0].missed == 4


# ---------------------------------------------------------------------- the run writer
def test_the_run_writer_sends_in_order_off_the_callers_thread_and_waits_out_an_outage():
    from redis.exceptions import ConnectionError as RedisConnectionError

    writer = glue.RunWriter(retry_s=5.0)
    done: list[tuple[str, str]] = []
    ages: dict[str, float] = {}
    refusals = [RedisConnectionError("down"), RedisConnectionError("down")]

    def write(what: str) -> Any:
        def run(age_ms: float) -> None:
            if what == "start" and refusals:
                raise refusals.pop()
            ages[what] = age_ms
            done.append((what, threading.current_thread().name))
        return run

    writer.put("start", write("start"))
    writer.put("end", write("end"))
    assert writer.flush(timeout=5)
    assert done == [("start", "jobbers-periodic-writer"), ("end", "jobbers-periodic-writer")]
    # each is sent with its age: the two refusals waited 0.05 + 0.1 s
    assert 140 <= ages["start"] < 5000
    assert 140 <= ages["end"] < 5000


def test_a_start_and_an_end_sent_late_are_judged_at_their_time(reader):
    """The writer hands each write its age: a run started on its slot and sent 30 s later
    is not late; the end of the previous run sent after the next run's start, though it
    happened before, does not make the next run overlapping (no alert either)."""
    w = Watched(tolerance=10.0)
    w.watch.learn([every(60)], "beat")
    w.watch.published(every(60), "r1", slot_in_ms=0)
    w.store.advance(30)
    w.watch.started("tick", "r1", "proj.add", age_ms=30_000)  # on its slot, sent now
    w.watch.published(every(60), "r2", slot_in_ms=0)
    w.store.advance(1)
    w.watch.started("tick", "r2", "proj.add", age_ms=500)
    w.watch.ended("tick", "r1", "SUCCESS", age_ms=1000)  # before r2's start, sent after
    s = w.one()
    assert (s.late, s.overlapping) == (0, 0)
    assert w.alerts == []
    assert counted(reader) == {}
    # a run still running past the bound an end may wait: the next one overlapped it
    w.watch.published(every(60), "r3", slot_in_ms=0)
    w.watch.started("tick", "r3", "proj.add")
    w.store.advance(MAX_EVENT_AGE_MS / 1000 + 1)
    w.watch.ended("tick", "r3", "SUCCESS")
    assert w.one().overlapping == 1
    assert [r.id for r in w.one().runs if r.overlapping] == ["r3"]
    assert [(a.kind, a.key) for a in w.alerts] == [(AlertKind.PERIODIC_OVERLAP, "tick")]


def test_the_run_writer_drops_a_failing_write_logged_and_bounds_its_queue(caplog):
    writer = glue.RunWriter(limit=2)
    gate, entered = threading.Event(), threading.Event()

    def blocked(_age: float) -> None:
        entered.set()
        gate.wait(5)

    writer.put("blocked", blocked)
    assert entered.wait(5)  # being sent: no longer waiting
    writer.put("a bad write", lambda _: 1 / 0)  # type: ignore[func-returns-value]
    writer.put("one more", lambda _: None)
    writer.put("one too many", lambda _: None)  # 2 wait already
    gate.set()
    assert writer.flush(timeout=5)
    assert "could not record the a bad write" in caplog.text
    assert "dropped 1 run write" in caplog.text


def test_a_forked_child_has_a_writer_of_its_own_even_if_the_parents_was_busy():
    import os

    writer = glue.RunWriter()
    os.register_at_fork(after_in_child=writer.after_fork)
    gate, entered = threading.Event(), threading.Event()

    def busy(_age: float) -> None:
        entered.set()
        gate.wait(5)

    writer.put("busy", busy)
    writer.put("queued in the parent", lambda _: None)
    assert entered.wait(5)
    with writer._lock:  # held at the fork, as the parent's thread may hold it
        read, write = os.pipe()
        pid = os.fork()
    if pid == 0:  # the child: its own queue and thread; the parent's queue is not sent
        code = 1
        try:
            writer.put("the child's", lambda _: os.write(write, b"child") and None)
            code = 0 if writer.flush(timeout=5) and len(writer._queue) == 0 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    gate.set()
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.read(read, 10) == b"child"
    assert writer.flush(timeout=5)
