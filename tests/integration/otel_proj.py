"""``tests.integration.proj`` with an OpenTelemetry SDK (``celery -A tests.integration.otel_proj``).

The in-memory reader has to live in the process that records, so a worker of this app
installs the SDK itself and writes what it collected, every 0.1 s and when it exits, to
``$PROJ_OTEL_DIR/<pid>.json`` (metric points, and finished spans when
``PROJ_OTEL_SPANS=1``, which also turns on ``opentelemetry-instrumentation-celery``).

``PROJ_OTEL=main`` installs it when the module is imported, in the worker's main process
(threads and solo pools: everything runs there); ``PROJ_OTEL=child`` in each prefork pool
child (``worker_process_init``), as the instrumentation's documentation advises. Without
``PROJ_OTEL`` (the test process imports this module for its tasks) nothing is installed.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from celery import signals

from jobbers_celery import JobbersTask
from tests.integration.proj import app, jobbers

__all__ = ["app", "hb_silent", "jobbers"]


@app.task(base=JobbersTask, bind=True, name="proj.hb_silent", max_heartbeat_interval=0.3)
def hb_silent(self: JobbersTask, seconds: float) -> float:
    """Promises a heartbeat every 0.3 s and sends none: the cleaner stalls it."""
    time.sleep(seconds)
    return seconds


def _points(reader: Any) -> list[dict[str, Any]]:
    data = reader.get_metrics_data()
    out: list[dict[str, Any]] = []
    for resource in getattr(data, "resource_metrics", None) or ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    out.append({
                        "scope": scope.scope.name, "name": metric.name, "unit": metric.unit,
                        "kind": type(metric.data).__name__,
                        "attributes": dict(point.attributes or {}),
                        **{k: getattr(point, k) for k in ("value", "count", "sum", "min", "max")
                           if hasattr(point, k)},
                    })
    return out


def _spans(exporter: Any) -> list[dict[str, Any]]:
    if exporter is None:
        return []
    out = []
    for span in exporter.get_finished_spans():
        out.append({
            "name": span.name, "kind": span.kind.name,
            "trace_id": span.context.trace_id, "span_id": span.context.span_id,
            "parent_span_id": span.parent.span_id if span.parent else None,
            "status": span.status.status_code.name,
            "attributes": {k: v if isinstance(v, str | int | float | bool) else list(v)
                           for k, v in (span.attributes or {}).items()},
            "events": [event.name for event in span.events],
        })
    return out


def _install() -> None:
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    exporter = None
    if os.environ.get("PROJ_OTEL_SPANS") == "1":
        from opentelemetry import trace
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        CeleryInstrumentor().instrument()

    target = Path(os.environ["PROJ_OTEL_DIR"]) / f"{os.getpid()}.json"
    lock = threading.Lock()

    def dump() -> None:
        with lock:
            snapshot = {"pid": os.getpid(), "points": _points(reader),
                        "spans": _spans(exporter)}
            tmp = target.with_suffix(".tmp")
            tmp.write_text(json.dumps(snapshot, default=str))
            os.replace(tmp, target)

    def loop() -> None:
        while True:
            try:
                dump()
            except Exception as exc:  # noqa: BLE001 - a test helper: say it, keep going
                print(f"otel_proj: dump failed: {exc!r}", flush=True)
            time.sleep(0.1)

    threading.Thread(target=loop, name="otel-dump", daemon=True).start()
    atexit.register(dump)
    signals.worker_shutdown.connect(lambda **_: dump(), weak=False)


_WHERE = os.environ.get("PROJ_OTEL")
if _WHERE == "main":
    _install()
elif _WHERE == "child":
    signals.worker_process_init.connect(lambda **_: _install(), weak=False)
