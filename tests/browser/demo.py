"""Demo data of the browser tests and of the docs' screenshots (the same data, so the docs
show what the tests check): dead letters of four tasks spread over the last day, written
through the Django sink, and task records in Redis (a lifecycle, running tasks reporting
progress, stalled and scheduled tasks, an hour of per-state counts)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

TRACEBACK = """Traceback (most recent call last):
  File "/srv/shop/.venv/lib/python3.11/site-packages/celery/app/trace.py", line 453, in trace_task
    R = retval = fun(*args, **kwargs)
  File "/srv/shop/shop/tasks.py", line 88, in {task}
    {call}
  File "/srv/shop/shop/{module}.py", line 41, in {function}
    raise {exception}(...)
{exception}: {message}
"""
#: The secret every demo dead letter carries in its kwargs: it must never reach a page.
SECRET = "sk_live_51HxYdemo"
#: What the running demo tasks report: shapes the pages draw as a bar (any {x, of|total}, as
#: the example project's own tasks report), and a bare number, a counter (never a bar).
PROGRESS = ({"done": 48_200, "total": 120_000, "supplier_token": "x"},
            {"chunk": 11, "of": 60}, {"batch": 51, "of": 400}, 1)


def seed_dead_letters() -> str:
    """Dead letters of four tasks, some with several failures, spread over the last 20
    hours (the groups' charts have something to show); returns the task id whose detail
    page is shown (two failures, a lifecycle in Redis)."""
    from jobbers_celery import DeadLetter
    from jobbers_django import services
    from jobbers_django.sink import write_entry

    now = datetime.now(UTC).replace(microsecond=0)

    def letter(name: str, n: int, **over: Any) -> DeadLetter:
        values: dict[str, Any] = {
            "task_id": str(uuid.uuid4()), "name": name, "version": 2, "queue": "imports",
            "reason": "failed", "args": [f"https://supplier-{n % 3}.example.com/feed.xml"],
            "kwargs": {"supplier_id": 40 + n % 3, "api_key": SECRET},
            "exception_type": "shop.tasks.SupplierTimeout",
            "exception_message": f"supplier-{n % 3}.example.com did not answer within 30s",
            "traceback": None, "attempt": 4, "retry_attempt": 3, "worker": "celery@web-2",
            "failed_at": now - timedelta(minutes=7 * n), "checkpoint": {"row": 1200 + n},
            "options": {"queue": "imports", "headers": {"Authorization": "Bearer demo"}},
        }
        values.update(over)
        if values["traceback"] is None and values["exception_type"]:
            payment = name == "shop.charge_payment"
            values["traceback"] = TRACEBACK.format(
                task=name.split(".")[1], exception=values["exception_type"],
                call="gateway.charge(order_id)" if payment else "supplier.fetch(url)",
                module="payments" if payment else "suppliers",
                function="charge" if payment else "fetch", message=values["exception_message"])
        return DeadLetter(**values)

    for n in range(14):  # an outage of the suppliers: most of it 2-6 hours ago
        write_entry(letter("shop.import_catalog", n,
                           failed_at=now - timedelta(minutes=(17 * n + 120) % 1100 + 5)))
    for n in range(6):
        write_entry(letter(
            "shop.charge_payment", n, version=1, queue="payments", args=[91800 + n],
            kwargs={"order_id": 91800 + n, "card_token": "tok_demo"},
            exception_type="shop.tasks.PaymentGatewayBusy",
            exception_message=f"503 from the payment gateway for order {91800 + n}",
            checkpoint=None, options={"queue": "payments"},
            failed_at=now - timedelta(minutes=150 * n + 3)))
    for n in range(3):
        write_entry(letter(
            "shop.sync_inventory", n, version=1, queue="celery", reason="stalled",
            exception_type=None, exception_message="no heartbeat for 64s (limit 60s)",
            traceback="", worker="celery@batch-1", kwargs={"warehouse": "north"},
            failed_at=now - timedelta(hours=9, minutes=n)))
    for n in range(2):
        write_entry(letter(
            "shop.send_newsletter", n, version=3, queue="mail", reason="dropped",
            exception_type=None, exception_message="no worker runs shop.send_newsletter "
            "version 3 (workers have version 2)", traceback="", worker="celery@mail-1",
            kwargs={"issue": 42}, failed_at=now - timedelta(hours=15, minutes=n)))

    # one task that stalled two days ago, was resubmitted, then failed again after a retry
    shown = letter("shop.import_catalog", 1, attempt=1, retry_attempt=0, reason="stalled",
                   exception_type=None, traceback="", worker="celery@web-1",
                   exception_message="worker celery@web-1 lost (no sign of life for 61s)",
                   failed_at=now - timedelta(days=2))
    write_entry(shown)
    write_entry(letter("shop.import_catalog", 1, task_id=shown.task_id, attempt=3,
                       retry_attempt=1, failed_at=now - timedelta(minutes=2)))

    payments = services.Selection(filters={"task_name": "shop.charge_payment"}, limit=2)
    services.discard(payments)
    return shown.task_id


def create(store: Any, task_id: str, name: str, queue: str) -> None:
    """A submitted task record, as publishing makes one."""
    from jobbers_celery import TaskState as S

    store.step(task_id, S.SUBMITTED, sources=(S.UNSUBMITTED,), name=name,
               create={"name": name, "queue": queue, "ver": "2"},
               set_fields={"msg": json.dumps({"args": [], "kwargs": {}, "options": {}}),
                           "retries": "0"}, reason="published")


def start_with_progress(store: Any, name: str, progress: Any, worker: str) -> str:
    """A running task that reported ``progress`` with its heartbeat; returns its id."""
    from jobbers_celery import TaskState as S

    task_id = str(uuid.uuid4())
    create(store, task_id, name, "imports")
    started = store.step(task_id, S.STARTED, start=True, worker=worker)
    store.heartbeat(task_id, started.attempt, progress=json.dumps(progress), name=name)
    return task_id


def report_progress(store: Any, task_id: str, progress: Any) -> None:
    """A later heartbeat of the running ``task_id`` with new progress."""
    record = store.get(task_id)
    store.heartbeat(task_id, record.attempt, progress=json.dumps(progress), name=record.name)


def seed_records(jobbers: Any, shown: str) -> list[str]:
    """Task records in Redis: the shown entry's lifecycle, running tasks with progress,
    stalled and scheduled ones, and an hour of per-state counts; returns the running ids."""
    from jobbers_celery import TaskState as S

    store = jobbers.store

    def error(kind: str, message: str) -> dict[str, str]:
        return {"err": json.dumps({"type": kind, "message": message})}

    timeout = ("shop.tasks.SupplierTimeout", "supplier-1.example.com did not answer within 30s")
    create(store, shown, "shop.import_catalog", "imports")
    store.step(shown, S.STARTED, start=True, worker="celery@web-1")
    store.step(shown, S.STALLED, reason="worker celery@web-1 lost")
    store.step(shown, S.SUBMITTED, reason="resubmitted from the dead-letter queue")
    store.step(shown, S.STARTED, start=True, worker="celery@web-2")
    store.step(shown, S.SCHEDULED, delay_ms=0, set_fields={**error(*timeout), "retries": "1"},
               reason="SupplierTimeout, retry 1 of 1 in 10s")
    store.step(shown, S.SUBMITTED, reason="run_at reached")
    store.step(shown, S.STARTED, start=True, worker="celery@web-2")
    store.step(shown, S.FAILED, set_fields=error(*timeout), reason="retries exhausted")

    running = [start_with_progress(store, name, progress, f"celery@batch-{n + 1}")
               for n, (name, progress) in enumerate(zip(
                   ("shop.import_catalog", "shop.rebuild_search_index", "shop.export_orders",
                    "shop.send_newsletter"),
                   PROGRESS, strict=True))]
    from jobbers_django.models import DeadLetterEntry

    for task_id in DeadLetterEntry.objects.filter(reason="stalled", task_name="shop.sync_inventory"
                                                  ).values_list("task_id", flat=True)[:2]:
        create(store, task_id, "shop.sync_inventory", "celery")
        store.step(task_id, S.STARTED, start=True, worker="celery@batch-1")
        store.step(task_id, S.STALLED, set_fields=error(
            "jobbers.Stalled", "no heartbeat for 64s (limit 60s)"), reason="heartbeat silent")
    for n, delay in enumerate((45_000, 300_000, 1_800_000)):
        task_id = str(uuid.uuid4())
        create(store, task_id, "shop.charge_payment", "payments")
        store.step(task_id, S.STARTED, start=True, worker="celery@web-2")
        store.step(task_id, S.SCHEDULED, delay_ms=delay, set_fields={**error(
            "shop.tasks.PaymentGatewayBusy", f"503 from the payment gateway for order {n}"),
            "retries": "1"}, reason="PaymentGatewayBusy, retry 1 of 4")
    seed_history(store)
    return running


def seed_history(store: Any, minutes: int = 60) -> None:
    """An hour of per-state counts as the workers would have sampled them (a batch run
    that peaked half an hour ago), ending with a real sample of the current counts."""
    import math

    now = store.now_ms()
    minute = now - now % 60_000
    current = {state.value: n for state, n in store.counts().items()}
    samples = {}
    for m in range(minutes, 0, -1):
        t = (minutes - m) / minutes
        wave = math.sin(math.pi * t) ** 2  # 0 now: the history ends at the current counts
        extra = {"submitted": 40 * wave, "started": 9 * wave, "scheduled": 5 * wave,
                 "completed": 400 * math.sin(math.pi * t), "failed": 6 * wave,
                 "stalled": 2 * wave}
        counts = {state: n + int(extra.get(state, 0)) for state, n in current.items()}
        at = minute - m * 60_000
        samples[json.dumps({"at": at, "counts": counts})] = at
    store.client.zadd(store.keys.count_history, samples)
    store.sample_counts(120)
