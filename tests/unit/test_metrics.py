"""jobbers_celery.telemetry.metrics without Redis or workers: instruments, attributes, the gauge lease
logic (against a fake store), and the no-op paths (no SDK; no opentelemetry-api at all)."""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from jobbers_celery import DeadLetter, JobbersConfig, TaskState
from jobbers_celery.core.records import from_ms
from jobbers_celery.deadletter.redis_sink import RedisDeadLetterSink
from jobbers_celery.deadletter.sink import SizedDeadLetterSink
from jobbers_celery.store.keys import Keys
from jobbers_celery.telemetry import metrics
from jobbers_celery.testing import InMemoryStore

PACKAGE = Path(__file__).resolve().parents[2] / "jobbers_celery"


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    """A private provider (the global one stays untouched); no gauges watched but ours."""
    saved = metrics._sources
    metrics._sources = tuple
    found = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[found]))
    yield found
    metrics.set_meter_provider(None)
    metrics._sources = saved


def collect(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """name -> [(attributes, value or histogram point)]"""
    out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    data = reader.get_metrics_data()
    for resource in getattr(data, "resource_metrics", None) or ():
        for scope in resource.scope_metrics:
            assert scope.scope.name == "jobbers_celery"
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", point)
                    out.setdefault(metric.name, []).append((dict(point.attributes or {}), value))
    return out


def units(reader: InMemoryMetricReader) -> dict[str, str]:
    data = reader.get_metrics_data()
    return {m.name: m.unit or "" for r in data.resource_metrics for s in r.scope_metrics
            for m in s.metrics}


def entry(name: str, version: int | None, queue: str | None) -> DeadLetter:
    return DeadLetter(task_id="9f1c-task-id", name=name, version=version, queue=queue,
                      reason="failed", args=[], kwargs={}, exception_type=None,
                      exception_message=None, traceback=None, attempt=1, retry_attempt=0,
                      worker=None, failed_at=from_ms(1_700_000_000_000))  # type: ignore[arg-type]


def test_instruments_have_the_contract_names_units_and_attributes(reader):
    metrics.selected("proj.a", "celery", metrics.ROLE_WORKER, 120.0)
    metrics.selected("proj.a", "celery", metrics.ROLE_SCHEDULER, -5.0)  # clock skew: 0
    metrics.attempt_ended("proj.a", "celery", "completed", now_ms=10_000, started_ms=9_000,
                          enqueued_ms=8_000)
    metrics.retried("proj.a", 3, "celery")
    metrics.dead_lettered([entry("proj.a", 3, "celery"), entry("proj.b", None, None)])
    got = collect(reader)
    assert set(got) == set(metrics.INSTRUMENTS)
    assert got["tasks_selected"] == [
        ({"task": "proj.a", "queue": "celery", "role": "worker"}, 1),
        ({"task": "proj.a", "queue": "celery", "role": "scheduler"}, 1)]
    waits = {a["role"]: (p.count, p.sum) for a, p in got["time_in_queue"]}
    assert waits == {"worker": (1, 120.0), "scheduler": (1, 0.0)}
    done = {"task": "proj.a", "queue": "celery", "status": "completed"}
    assert got["tasks_processed"] == [(done, 1)]
    [(attrs, ran)] = got["execution_time"]
    assert (attrs, ran.count, ran.sum) == (done, 1, 1000.0)
    [(attrs, e2e)] = got["end_to_end_latency"]
    assert (attrs, e2e.count, e2e.sum) == (done, 1, 2000.0)
    assert got["tasks_retried"] == [({"task": "proj.a", "version": 3, "queue": "celery"}, 1)]
    # an unknown version is left out rather than invented; an unknown queue is ""
    assert got["tasks_dead_lettered"] == [
        ({"task": "proj.a", "version": 3, "queue": "celery"}, 1),
        ({"task": "proj.b", "queue": ""}, 1)]
    assert units(reader) == {
        "tasks_selected": "{task}", "time_in_queue": "ms", "tasks_processed": "{task}",
        "execution_time": "ms", "end_to_end_latency": "ms", "tasks_retried": "{task}",
        "tasks_dead_lettered": "{task}"}
    # buckets suited to long tasks (hours), not the SDK's default that stops at 10 s
    assert max(ran.explicit_bounds) >= 3_600_000


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled", "stalled", "dropped",
                                    "retried", "resubmitted"])
def test_end_to_end_latency_only_for_outcomes_that_end_the_run(reader, status):
    started = None if status == "dropped" else 1_000.0
    metrics.attempt_ended("t", "q", status, now_ms=5_000, started_ms=started, enqueued_ms=0)
    got = collect(reader)
    assert got["tasks_processed"] == [({"task": "t", "queue": "q", "status": status}, 1)]
    assert len(got.get("execution_time", [])) == (0 if started is None else 1)
    final = status in {"completed", "failed", "cancelled", "stalled", "dropped"}
    assert len(got.get("end_to_end_latency", [])) == (1 if final else 0)


def test_a_failing_instrument_never_breaks_the_caller(reader, monkeypatch, caplog):
    instruments = metrics._get()
    assert instruments is not None

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("exporter on fire")

    for name in ("selected", "processed", "retried", "dead_lettered"):
        monkeypatch.setattr(getattr(instruments, name), "add", broken)
    with caplog.at_level(logging.DEBUG, logger="jobbers.metrics"):
        metrics.selected("t", "q", metrics.ROLE_WORKER, 1.0)
        metrics.attempt_ended("t", "q", "completed", now_ms=2, started_ms=1, enqueued_ms=0)
        metrics.retried("t", 1, "q")
        metrics.dead_lettered([entry("t", 1, "q")])
    logged = [r for r in caplog.records if r.name == "jobbers.metrics"]
    assert [r.levelno for r in logged] == [logging.DEBUG] * 4
    assert all(r.exc_info and "exporter on fire" in str(r.exc_info[1]) for r in logged)


def test_time_stamps_from_headers_and_records():
    assert metrics.ms_value(1_700_000_000_123) == 1_700_000_000_123.0
    assert metrics.ms_value("1700000000123") == 1_700_000_000_123.0
    for bad in (None, "", "soon", True, object()):
        assert metrics.ms_value(bad) is None
    assert metrics.started_ms({"start_at": "100", "retry_at": "250"}) == 250.0
    assert metrics.started_ms({"start_at": "100", "retry_at": ""}) == 100.0
    assert metrics.started_ms({}) is None


# ----------------------------------------------------------------------------- gauges
class Leases(InMemoryStore):
    """The in-memory store in namespace ``jb``, keeping every lease asked for; two tasks
    submitted, one completed, and a cleaner pass 2.5 s ago."""

    prefix = "jb"

    def __init__(self, holder: bool) -> None:
        super().__init__()
        self.leases: list[tuple[str, str, int]] = []
        if not holder:  # another process holds the gauges' lease
            super().hold_lease(self.keys.metrics_lease, "another", 60_000)
        for task_id in ("a", "b", "c"):
            self.submit(task_id, sources=(TaskState.UNSUBMITTED,), reason="published",
                        create={"name": "n", "queue": "q"})
        attempt = self.start("c", name="n", worker=None, wid="w:1", heartbeat_ms=None,
                             cap=None, lease_cap_ms=60_000, defer_ms=1000, fields={}).attempt
        self.complete("c", attempt, name="n", worker=None, wid="w:1", fields={}, delete=(),
                      write_result=None)
        self.record_pass(self.now_ms() - 2_500, 1.0, "test", {})

    def hold_lease(self, key: str, token: str, ttl_ms: int) -> bool:
        self.leases.append((key, token, ttl_ms))
        return super().hold_lease(key, token, ttl_ms)


COUNTS = {state.value: {TaskState.SUBMITTED: 2, TaskState.COMPLETED: 1}.get(state, 0)
          for state in TaskState}


class SizedSink:
    def write(self, entry: DeadLetter) -> None:
        pass

    def size(self) -> int:
        return 7


class PlainSink:
    def write(self, entry: DeadLetter) -> None:
        pass


class Source:
    """What the gauges read of an installed instance (``metrics.GaugeSource``)."""

    def __init__(self, holder: bool, sink: object) -> None:
        self.store = Leases(holder)
        self.sink = sink
        self.config = JobbersConfig(redis_url="redis://127.0.0.1:1/0", metrics_gauge_lease=30)


def test_the_lease_holder_reports_the_gauges(reader):
    jobbers = Source(holder=True, sink=SizedSink())
    metrics.watch(lambda: [jobbers])
    got = collect(reader)
    assert {a["state"]: v for a, v in got["tasks_in_state"]} == COUNTS
    assert got["dead_letter_queue_size"] == [({}, 7)]
    [(labels, age)] = got["cleaner_last_pass_age"]
    assert (labels, age) == ({}, pytest.approx(2.5, abs=0.5))
    assert units(reader)["cleaner_last_pass_age"] == "s"
    # one lease round trip for the three gauges of a collection; the key from keys.py
    [(key, token, ttl_ms)] = jobbers.store.leases
    assert (key, ttl_ms) == (Keys("jb").metrics_lease, 30_000)
    assert str(__import__("os").getpid()) in token


def test_other_processes_report_no_gauges(reader):
    jobbers = Source(holder=False, sink=SizedSink())
    metrics.watch(lambda: [jobbers])
    got = collect(reader)
    assert not set(got) & set(metrics.GAUGES)
    assert len(jobbers.store.leases) == 1


def test_no_dead_letter_gauge_for_a_sink_without_size(reader):
    assert isinstance(SizedSink(), SizedDeadLetterSink)
    assert callable(getattr(RedisDeadLetterSink, "size", None))
    jobbers = Source(holder=True, sink=PlainSink())
    metrics.watch(lambda: [jobbers])
    got = collect(reader)
    assert "dead_letter_queue_size" not in got
    assert "tasks_in_state" in got
    assert "cleaner_last_pass_age" in got


def test_instances_on_two_stores_report_their_sum(reader):
    """Two installed instances on two stores: one series per state, their sum (the SDK
    would keep only the last of two observations of one attribute set)."""
    first, second = Source(holder=True, sink=SizedSink()), Source(holder=True, sink=SizedSink())
    second.store.record_pass(second.store.now_ms() - 9_000, 1.0, "test", {})
    metrics.watch(lambda: [first, second])
    got = collect(reader)
    assert {a["state"]: v for a, v in got["tasks_in_state"]} == {
        state: 2 * n for state, n in COUNTS.items()}
    assert got["dead_letter_queue_size"] == [({}, 14)]
    [(_, age)] = got["cleaner_last_pass_age"]
    assert age == pytest.approx(9.0, abs=0.5)  # the oldest pass


def test_sinks_of_one_queue_count_once(reader):
    """Two instances whose sinks count one table (Django's, ``size_scope``): its size once."""
    class TableSink(SizedSink):
        size_scope = "one table"

    first, second = Source(holder=True, sink=TableSink()), Source(holder=True, sink=TableSink())
    metrics.watch(lambda: [first, second])
    assert collect(reader)["dead_letter_queue_size"] == [({}, 7)]


def test_a_forked_child_asks_for_the_lease_with_its_own_token(reader, monkeypatch):
    jobbers = Source(holder=True, sink=PlainSink())
    metrics.watch(lambda: [jobbers])
    collect(reader)
    monkeypatch.setattr("os.getpid", lambda: 4_000_000)
    collect(reader)  # within the cache period, but another process: asks again
    (_, parent, _), (_, child, _) = jobbers.store.leases
    assert parent != child
    assert ":4000000:" in child


def test_gauge_lease_setting_is_validated():
    from jobbers_celery import ConfigurationError

    conf = {"jobbers_redis_url": "redis://127.0.0.1:1/0"}
    assert JobbersConfig.from_mapping(conf).metrics_gauge_lease == 120.0
    assert JobbersConfig.from_mapping({**conf, "jobbers_metrics_gauge_lease": 5}) \
        .metrics_gauge_lease == 5
    with pytest.raises(ConfigurationError, match="jobbers_metrics_gauge_lease"):
        JobbersConfig.from_mapping({**conf, "jobbers_metrics_gauge_lease": 0})


# ----------------------------------------------------------------------------- no-op paths
def blocking(prefix: str) -> str:
    """Code that makes every import of ``prefix`` (and its submodules) fail."""
    return (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {prefix!r} or name.startswith({prefix + '.'!r}):\n"
        "            raise ImportError(f'blocked {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
    )


_EXERCISE = """
from celery import Celery
from jobbers_celery import install
from jobbers_celery.telemetry import metrics
from jobbers_celery.testing import InMemoryStore
app = Celery("x", broker="redis://127.0.0.1:1/0")
install(app)  # creates the instruments and watches the gauges; no Redis call
metrics.selected("t", "q", metrics.ROLE_WORKER, 1.0)
metrics.attempt_ended("t", "q", "completed", now_ms=2, started_ms=1, enqueued_ms=0)
metrics.retried("t", 1, "q")
metrics.dead_lettered([])
"""


def run_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_with_the_api_only_everything_is_a_no_op():
    # the SDK made unimportable: what an application without one has (redis-py imports
    # the SDK by itself when it is installed, so merely not importing it proves nothing)
    out = run_python(blocking("opentelemetry.sdk") + _EXERCISE + (
        "from opentelemetry.metrics import get_meter_provider\n"
        "print(type(get_meter_provider()).__name__, type(metrics._get().processed).__name__)\n"))
    assert out == "_ProxyMeterProvider _ProxyCounter"


def test_without_opentelemetry_api_everything_is_a_no_op():
    out = run_python(blocking("opentelemetry") + _EXERCISE + (
        "print(metrics._otel, metrics._get(),"
        " [m for m in sys.modules if m.startswith('opentelemetry')])\n"))
    assert out == "None None []"


def test_the_library_imports_the_opentelemetry_api_only():
    """No module of jobbers_celery imports the SDK (or anything of OpenTelemetry but the
    metrics API, in metrics.py, and the context, propagation and trace API, in tracing.py);
    metrics.py imports nothing else outside the standard library at run time."""
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name.startswith("opentelemetry") and path.name == "tracing.py":
                    assert name == "opentelemetry", (path, name)  # context, propagate, trace
                elif name.startswith("opentelemetry"):
                    assert path.name == "metrics.py", (path, name)
                    assert name in ("opentelemetry", "opentelemetry.metrics"), (path, name)
    tree = ast.parse((PACKAGE / "telemetry" / "metrics.py").read_text())
    runtime = []
    for node in tree.body:  # module level, outside ``if TYPE_CHECKING``
        if isinstance(node, ast.Import):
            runtime += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            runtime.append(node.module or "")
        elif isinstance(node, ast.Try):
            for inner in node.body:
                if isinstance(inner, ast.ImportFrom):
                    runtime.append(f"{inner.module}.{inner.names[0].name}")
    third_party = {n.split(".")[0] for n in runtime} - set(sys.stdlib_module_names)
    assert third_party == {"opentelemetry"}
    assert "opentelemetry.metrics" in runtime
