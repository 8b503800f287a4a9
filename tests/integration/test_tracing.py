"""All attempts of a task are one trace (docs/howto/metrics.md, "Traces across retries and
resubmits"): the delayed retries and the delayed first run the scheduler publishes, an
immediate retry, and a resubmit from the dead-letter entry or from the record (the payload
a stall recovery publishes) continue the publishing client's trace, with the OpenTelemetry SDK and ``opentelemetry-instrumentation-celery`` in the
worker's main process or in its pool children only.

The client is this test process: it publishes inside a span of a private SDK tracer (no
instrumentation here). The workers run ``tests.integration.otel_proj``, whose in-memory
span exporter writes what it collected to a JSON file per process (see test_metrics).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from jobbers_celery import TaskState
from tests.conftest import wait_for
from tests.integration.lifecycle_helpers import dead_letters, unique, wait_state
from tests.integration.test_metrics import OTEL_APP, Otel

pytestmark = [pytest.mark.redis, pytest.mark.worker]

S = TaskState
TRACER = TracerProvider().get_tracer("tests.client")


@pytest.fixture
def otel(tmp_path: Path) -> Otel:
    return Otel(tmp_path / "otel")


def _spans(otel: Otel, task_id: str, count: int, name: str) -> list[dict[str, Any]]:
    """The ``count`` finished spans called ``name`` of ``task_id`` (polled)."""
    def found() -> list[dict[str, Any]] | None:
        spans = [s for s in otel.spans() if s["name"] == name
                 and s["attributes"].get("messaging.message.id") == task_id]
        return spans if len(spans) >= count else None

    spans: list[dict[str, Any]] = wait_for(found, timeout=20,
                                           message=f"{count} {name} spans of {task_id}")
    return spans


def test_every_republish_stays_in_the_clients_trace(proj, worker_factory, otel):
    """SDK and instrumentation in the worker's main process (threads pool: the tasks and
    the scheduler thread in one process): the scheduler's ``apply_async`` span of each
    delayed retry is a child of the attempt that retried, the next attempt its child."""
    jobbers = proj.jobbers
    # one thread: two attempts of a task never overlap there (the instrumentation keeps one
    # span per task id, and an immediate retry may start before its attempt's span ended)
    worker = worker_factory(pool="threads", concurrency=1, app=OTEL_APP,
                            env=otel.env(PROJ_OTEL_SPANS="1"))
    retries = 3
    with TRACER.start_as_current_span("client") as client:
        flaky = proj.flaky.apply_async((retries, 0.2))
        once = proj.fail_once.delay(unique("trace"))
        later = proj.add.apply_async((1, 2), countdown=0.2)  # the scheduler publishes it
        at_once = proj.flaky.delay(1)  # an immediate retry, published by its attempt
    trace_id = client.get_span_context().trace_id
    wait_state(jobbers, flaky.id, S.COMPLETED, worker=worker)
    wait_state(jobbers, once.id, S.FAILED, worker=worker)
    [entry] = dead_letters(jobbers, once.id)
    assert jobbers.resubmit_dead_letters([entry]) == [once.id]  # outside any span
    wait_state(jobbers, once.id, S.COMPLETED, worker=worker)

    runs = _spans(otel, flaky.id, retries + 1, "run/proj.flaky")
    published = _spans(otel, flaky.id, retries, "apply_async/proj.flaky")
    assert {s["trace_id"] for s in runs + published} == {trace_id}  # one trace, 4 attempts
    run_ids = {s["span_id"] for s in runs}
    assert all(p["parent_span_id"] in run_ids for p in published)  # retried in that attempt
    by_id = {s["span_id"]: s for s in published}
    assert sum(r["parent_span_id"] in by_id for r in runs) == retries
    [first] = [r for r in runs if r["parent_span_id"] not in by_id]
    assert first["parent_span_id"] == client.get_span_context().span_id

    [published_later] = _spans(otel, later.id, 1, "apply_async/proj.add")
    [ran_later] = _spans(otel, later.id, 1, "run/proj.add")
    assert published_later["parent_span_id"] == client.get_span_context().span_id
    assert ran_later["parent_span_id"] == published_later["span_id"]
    assert ran_later["trace_id"] == trace_id

    at_once_runs = _spans(otel, at_once.id, 2, "run/proj.flaky")
    [published_at_once] = _spans(otel, at_once.id, 1, "apply_async/proj.flaky")
    assert {s["trace_id"] for s in [*at_once_runs, published_at_once]} == {trace_id}

    once_runs = _spans(otel, once.id, 2, "run/proj.fail_once")
    assert [s["trace_id"] for s in once_runs] == [trace_id, trace_id]
    assert {s["parent_span_id"] for s in once_runs} == {client.get_span_context().span_id}


def test_retries_and_a_resubmit_stay_in_the_trace_with_the_sdk_in_children_only(
        proj, worker_factory, otel):
    """The main process has no SDK: its scheduler's republish still carries the context in
    the message headers, and the child's ``run`` span continues the trace."""
    worker = worker_factory(pool="prefork", concurrency=1, app=OTEL_APP,
                            env=otel.env(PROJ_OTEL="child", PROJ_OTEL_SPANS="1"))
    jobbers = proj.jobbers
    with TRACER.start_as_current_span("client") as client:
        flaky = proj.flaky.apply_async((2, 0.2))
        once = proj.fail_once.delay(unique("trace"))
    trace_id = client.get_span_context().trace_id
    wait_state(jobbers, flaky.id, S.COMPLETED, worker=worker)
    runs = _spans(otel, flaky.id, 3, "run/proj.flaky")
    assert {s["trace_id"] for s in runs} == {trace_id}
    run_ids = {s["span_id"] for s in runs}
    assert sum(r["parent_span_id"] in run_ids for r in runs) == 2  # each retry: its attempt

    # the payload on the record, as the cleaner's stall recovery publishes it
    wait_state(jobbers, once.id, S.FAILED, worker=worker)
    assert jobbers.resubmit([once.id]) == [once.id]
    wait_state(jobbers, once.id, S.COMPLETED, worker=worker)
    once_runs = _spans(otel, once.id, 2, "run/proj.fail_once")
    assert [s["trace_id"] for s in once_runs] == [trace_id, trace_id]
