"""OpenTelemetry metrics (docs/howto/metrics.md) read back with the SDK's in-memory reader.

Metrics recorded inside a worker are read in that worker: ``tests.integration.otel_proj``
installs the SDK there and writes what it collected to a JSON file per process, which the
tests poll. The cleaner's metrics are recorded in the test process itself (it runs the
pass), through a private meter provider (``metrics.set_meter_provider``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobbers_celery import TaskState
from jobbers_celery.telemetry import metrics
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import unique, wait_state

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
OTEL_APP = "tests.integration.otel_proj"
KEYS = {
    "tasks_retried": {"task", "version", "queue"},
    "tasks_dead_lettered": {"task", "version", "queue"},
    "tasks_processed": {"task", "queue", "status"},
    "execution_time": {"task", "queue", "status"},
    "end_to_end_latency": {"task", "queue", "status"},
    "time_in_queue": {"task", "queue", "role"},
    "tasks_selected": {"task", "queue", "role"},
}


class Otel:
    """What the workers' in-memory readers collected (one JSON file per process)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir()

    def env(self, **more: str) -> dict[str, str]:
        return {"PROJ_OTEL": "main", "PROJ_OTEL_DIR": str(self.dir), **more}

    def snapshots(self) -> dict[int, dict[str, Any]]:
        out = {}
        for path in self.dir.glob("*.json"):
            try:
                snapshot = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being replaced
            out[int(snapshot["pid"])] = snapshot
        return out

    def points(self, name: str | None = None, scope: str | None = "jobbers_celery",
               **attrs: Any) -> list[dict[str, Any]]:
        return [p for s in self.snapshots().values() for p in select(s["points"], name, scope,
                                                                     **attrs)]

    def spans(self) -> list[dict[str, Any]]:
        return [span for s in self.snapshots().values() for span in s["spans"]]


def select(points: list[dict[str, Any]], name: str | None, scope: str | None = "jobbers_celery",
           **attrs: Any) -> list[dict[str, Any]]:
    return [p for p in points
            if (name is None or p["name"] == name) and (scope is None or p["scope"] == scope)
            and all(p["attributes"].get(k) == v for k, v in attrs.items())]


def total(points: list[dict[str, Any]]) -> float:
    """Counter value, or histogram count, summed over points."""
    return sum(p["count"] if "count" in p else p["value"] for p in points)


@pytest.fixture
def otel(tmp_path: Path) -> Otel:
    return Otel(tmp_path / "otel")


@pytest.fixture
def local_reader(proj: Any) -> Iterator[Any]:
    """An in-memory reader for what the test process itself records. Its gauges report
    ``proj``'s store alone: other tests in this process leave their apps installed, and
    the gauges add up every store the process reports for."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    saved = metrics._sources
    metrics.watch(lambda: [proj.jobbers])
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    yield reader
    metrics.set_meter_provider(None)
    metrics._sources = saved


def local_points(reader: Any) -> list[dict[str, Any]]:
    from tests.integration.otel_proj import _points

    return _points(reader)


def assert_attributes(points: list[dict[str, Any]], task_ids: list[str]) -> None:
    """Each instrument has exactly its attribute keys; no value is a task id."""
    for point in points:
        if point["name"] in KEYS:
            assert set(point["attributes"]) == KEYS[point["name"]], point
        for value in point["attributes"].values():
            assert value not in task_ids, point


# ----------------------------------------------------------------------------- worker paths
def test_every_lifecycle_path_is_measured(proj, worker_factory, otel):
    jobbers = proj.jobbers
    # PROJ_VERSION=2: proj.versioned (published as version 1 here) is dropped by the worker
    worker = worker_factory(pool="threads", concurrency=4, app=OTEL_APP,
                            env=otel.env(PROJ_VERSION="2"))
    key = unique("cancel")
    running = proj.heartbeating.delay(key, 20)
    results = {
        "add": proj.add.delay(1, 2),                   # completed
        "flaky": proj.flaky.delay(1),                  # immediate retry, then completed
        "flaky_delay": proj.flaky_delay.delay(1),      # delayed retry (scheduler), completed
        "boom": proj.boom.delay(),                     # failed, dead-lettered
        "nope": proj.app.send_task("proj.nope"),       # dropped: no such task
        "versioned": proj.versioned.delay(),           # dropped: version mismatch, DLQ
    }
    final = {"add": S.COMPLETED, "flaky": S.COMPLETED, "flaky_delay": S.COMPLETED,
             "boom": S.FAILED, "nope": S.DROPPED, "versioned": S.DROPPED}
    for how, result in results.items():
        wait_state(jobbers, result.id, final[how], worker=worker)
    wait_for(lambda: jobbers.store.client.lrange(key, 0, -1), message="heartbeating to start")
    assert jobbers.cancel(running.id)
    wait_state(jobbers, running.id, S.CANCELLED, worker=worker)

    processed = {
        ("proj.add", "completed"): 1, ("proj.flaky", "retried"): 1,
        ("proj.flaky", "completed"): 1, ("proj.flaky_delay", "retried"): 1,
        ("proj.flaky_delay", "completed"): 1, ("proj.boom", "failed"): 1,
        ("proj.heartbeating", "cancelled"): 1, ("proj.nope", "dropped"): 1,
        ("proj.versioned", "dropped"): 1,
    }

    def counted() -> bool:
        return all(total(otel.points("tasks_processed", task=t, status=s)) == n
                   for (t, s), n in processed.items())

    wait_for(counted, timeout=10, message="tasks_processed of every path")
    points = otel.points()
    assert total(select(points, "tasks_processed")) == sum(processed.values())
    for (task, status), n in processed.items():
        attrs = {"task": task, "status": status, "queue": "celery"}
        assert total(select(points, "tasks_processed", **attrs)) == n, attrs
        ran = 0 if status == "dropped" else n  # a dropped message never ran
        assert total(select(points, "execution_time", **attrs)) == ran, attrs
        # end to end: only outcomes that end the task's run
        e2e = 0 if status == "retried" else n
        assert total(select(points, "end_to_end_latency", **attrs)) == e2e, attrs

    # the first enqueue survives the delayed retry: end to end covers its 0.3 s delay
    [delayed] = select(points, "end_to_end_latency", task="proj.flaky_delay", status="completed")
    assert delayed["sum"] >= 300
    [ran] = select(points, "execution_time", task="proj.heartbeating")
    assert ran["sum"] > 0

    selected = {("proj.add", "worker"): 1, ("proj.flaky", "worker"): 2,
                ("proj.flaky_delay", "worker"): 2, ("proj.flaky_delay", "scheduler"): 1,
                ("proj.boom", "worker"): 1, ("proj.heartbeating", "worker"): 1}
    for (task, role), n in selected.items():
        attrs = {"task": task, "role": role, "queue": "celery"}
        assert total(select(points, "tasks_selected", **attrs)) == n, attrs
        assert total(select(points, "time_in_queue", **attrs)) == n, attrs
    assert total(select(points, "tasks_selected")) == sum(selected.values())
    [waited] = select(points, "time_in_queue", task="proj.flaky_delay", role="scheduler")
    assert 0 <= waited["max"] < 5000  # from run_at to the scheduler's claim

    assert {(p["attributes"]["task"], p["attributes"]["version"], p["value"])
            for p in select(points, "tasks_retried")} == {("proj.flaky", 1, 1),
                                                           ("proj.flaky_delay", 1, 1)}
    assert {(p["attributes"]["task"], p["attributes"]["version"], p["value"])
            for p in select(points, "tasks_dead_lettered")} == {("proj.boom", 1, 1),
                                                                 ("proj.versioned", 1, 1)}
    for point in points:
        if point["kind"] == "Histogram":
            assert point["unit"] == "ms", point
    assert_attributes(points, [r.id for r in (*results.values(), running)])


def test_shutdown_stop_and_resubmit_are_measured(proj, worker_factory, otel):
    worker = worker_factory(pool="threads", concurrency=2, app=OTEL_APP, env=otel.env())
    stop_key, resubmit_key = unique("stop"), unique("resubmit")
    stopped = proj.on_stop.delay(stop_key, 30)
    resubmitted = proj.on_resubmit.delay(resubmit_key, 30)
    client = proj.jobbers.store.client
    wait_for(lambda: client.llen(stop_key) and client.llen(resubmit_key),
             message="both tasks to start")
    assert worker.stop() == 0
    wait_state(proj.jobbers, stopped.id, S.STALLED)
    points = otel.points()  # written when the worker shut down
    stop = {"task": "proj.on_stop", "status": "stalled", "queue": "celery"}
    assert total(select(points, "tasks_processed", **stop)) == 1
    assert total(select(points, "execution_time", **stop)) == 1
    assert total(select(points, "end_to_end_latency", **stop)) == 1
    assert total(select(points, "tasks_dead_lettered", task="proj.on_stop", version=1)) == 1
    resubmit = {"task": "proj.on_resubmit", "status": "resubmitted", "queue": "celery"}
    assert total(select(points, "tasks_processed", **resubmit)) == 1
    assert total(select(points, "end_to_end_latency", **resubmit)) == 0  # it goes on
    assert total(select(points, "tasks_retried")) == 0  # no retry was used
    assert_attributes(points, [stopped.id, resubmitted.id])


def test_cleaner_stall_is_measured_where_the_cleaner_runs(proj, worker_factory, local_reader):
    from tests.integration.otel_proj import hb_silent

    jobbers = proj.jobbers
    worker = worker_factory(pool="threads", concurrency=1, app=OTEL_APP)  # no SDK there
    result = hb_silent.delay(2.0)
    wait_state(jobbers, result.id, S.STARTED, worker=worker)
    wait_for(lambda: jobbers.clean().stalled, timeout=5, message="the cleaner to stall it")
    points = local_points(local_reader)
    stalled = {"task": "proj.hb_silent", "status": "stalled", "queue": "celery"}
    assert total(select(points, "tasks_processed", **stalled)) == 1
    [ran] = select(points, "execution_time", **stalled)
    assert ran["count"] == 1
    assert ran["sum"] >= 300
    # the test process holds the gauge lease (the worker has no SDK): one stalled record
    [gauge] = select(points, "tasks_in_state", state="stalled")
    assert gauge["value"] == 1
    assert_attributes(points, [result.id])


# ----------------------------------------------------------------------------- beside OTel's
def test_prefork_children_record_beside_the_celery_instrumentation(proj, worker_factory, otel):
    """SDK and ``CeleryInstrumentor`` set up in each pool child (``worker_process_init``):
    jobbers records there, and the instrumentation's spans look as they do for a plain
    Celery task."""
    worker = worker_factory(pool="prefork", concurrency=1, app=OTEL_APP,
                            env=otel.env(PROJ_OTEL="child", PROJ_OTEL_SPANS="1"))
    chain = (proj.add.si(1, 2) | proj.headers.si()).apply_async()
    plain = proj.plain.delay(7)
    boom = proj.boom.delay()
    headers = chain.get(timeout=20)
    assert plain.get(timeout=20) == 7
    wait_state(proj.jobbers, boom.id, S.FAILED, worker=worker)
    # jobbers' headers are stamped beside the instrumentation's trace context
    assert headers["jobbers_task"] == "proj.headers"
    assert headers["jobbers_version"] == 1
    assert "jobbers_enqueued_at" in headers

    names = {"run/proj.add", "run/proj.headers", "apply_async/proj.headers", "run/proj.plain",
             "run/proj.boom"}
    spans = wait_for(lambda: (s := {x["name"]: x for x in otel.spans()}).keys() >= names and s,
                     message="the instrumentation's spans")
    for name in ("run/proj.add", "run/proj.headers", "run/proj.plain", "run/proj.boom"):
        assert spans[name]["kind"] == "CONSUMER", spans[name]
        assert spans[name]["attributes"]["celery.action"] == "run"
    assert spans["apply_async/proj.headers"]["kind"] == "PRODUCER"
    # the context it injects into the headers still reaches the task
    assert spans["run/proj.headers"]["parent_span_id"] == spans["apply_async/proj.headers"][
        "span_id"]
    assert spans["run/proj.headers"]["trace_id"] == spans["apply_async/proj.headers"]["trace_id"]
    assert spans["run/proj.add"]["attributes"]["messaging.message.id"] == chain.parent.id
    # a jobbers task's span has what a plain Celery task's span has
    assert set(spans["run/proj.add"]["attributes"]) == set(spans["run/proj.plain"]["attributes"])
    assert spans["run/proj.add"]["status"] == "UNSET"
    assert spans["run/proj.boom"]["status"] == "ERROR"
    assert "exception" in spans["run/proj.boom"]["events"]

    def recorded() -> bool:
        return all(total(otel.points("tasks_processed", task=t, status=s)) == 1
                   for t, s in (("proj.add", "completed"), ("proj.headers", "completed"),
                                ("proj.boom", "failed")))

    wait_for(recorded, message="jobbers' metrics from the pool child")
    assert otel.points("tasks_processed", task="proj.plain") == []  # not a jobbers task
    assert total(otel.points("tasks_selected", role="worker")) == 3
    # the instrumentation's own histogram is still there, beside jobbers' instruments
    assert otel.points("flower.task.runtime.seconds", scope=None)


# ----------------------------------------------------------------------------- gauges
def test_gauges_are_reported_by_one_process_of_the_cluster(proj, worker_factory, otel):
    jobbers = proj.jobbers
    # a 2 s lease, renewed every 0.5 s: a holder held off the CPU for 0.75 s (a loaded
    # machine) lost a 1 s one, and the other process reported meanwhile
    env = otel.env(PROJ_METRICS_LEASE="2")
    workers = [worker_factory(pool="threads", concurrency=2, app=OTEL_APP, env=env)
               for _ in range(2)]
    done = [proj.add.delay(i, i) for i in range(3)]
    boom = proj.boom.delay()
    for result in done:
        wait_state(jobbers, result.id, S.COMPLETED)
    wait_state(jobbers, boom.id, S.FAILED)
    jobbers.clean()
    expected = {s.value: 0 for s in S} | {"completed": 3, "failed": 1}

    def reporters(alive: set[int]) -> dict[int, list[dict[str, Any]]]:
        snaps = otel.snapshots()
        assert set(snaps) <= pids
        return {pid: gauges for pid, s in snaps.items() if pid in alive
                and (gauges := [p for p in s["points"] if p["name"] in metrics.GAUGES])}

    def settled(alive: set[int]) -> int | None:
        """The one process of ``alive`` reporting the expected gauges, once every process
        of ``alive`` has collected."""
        found = reporters(alive)
        if not alive <= set(otel.snapshots()) or len(found) != 1:
            return None
        [(pid, gauges)] = found.items()
        states = {p["attributes"]["state"]: p["value"]
                  for p in select(gauges, "tasks_in_state")}
        [dlq] = select(gauges, "dead_letter_queue_size") or [{"value": None}]
        ages = select(gauges, "cleaner_last_pass_age")
        if states != expected or dlq["value"] != 1 or not ages:
            return None
        assert 0 <= ages[0]["value"] < 60
        assert ages[0]["unit"] == "s"
        assert dlq["attributes"] == {}
        assert ages[0]["attributes"] == {}
        return pid

    pids = {w.proc.pid for w in workers}
    holder = wait_for(lambda: settled(pids), timeout=10, message="one process reporting")
    for _ in range(10):  # and only that one, collection after collection
        assert set(reporters(pids)) <= {holder}
        time.sleep(0.05)
    # the holder goes away: the other process takes the lease over once it lapses (2 s)
    [gone] = [w for w in workers if w.proc.pid == holder]
    assert gone.stop() == 0
    other = wait_for(lambda: settled(pids - {holder}), timeout=10,
                     message="the other process to take the gauges over")
    assert other != holder


def test_gauge_lease_and_cleaner_age_in_the_store(make_store):
    store, other = make_store(), make_store()
    key = store.keys.metrics_lease
    # 2 s: held through the checks below even if this process is held up a while (a 300 ms
    # lease lapsed in between on a loaded machine)
    assert store.hold_lease(key, "a", 2000)
    assert store.hold_lease(key, "a", 2000)  # renewed by its holder
    assert not other.hold_lease(key, "b", 2000)
    assert 0 < store.client.pttl(key) <= 2000
    # the holder stops renewing: the lease lapses and another token takes it
    wait_for(lambda: other.hold_lease(key, "b", 60_000), timeout=6, message="the lease to lapse")
    assert not store.hold_lease(key, "a", 2000)
    assert store.client.get(key) == "b"

    assert store.last_pass_age_ms() is None  # no pass yet
    store.record_pass(store.now_ms() - 1500, 1.0, "test", {})
    assert 1500 <= store.last_pass_age_ms() < 5000
