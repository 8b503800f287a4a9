"""The shop's Celery tasks: one per path a jobbers task can take.

``run.py`` submits each of them once (some twice) and shows what happens. Timings are short
so that the whole scenario settles in seconds; the options are the ones a real project sets.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from example.celery import app

from jobbers_celery import BackoffStrategy, DeadLetterPolicy, JobbersTask, ShutdownPolicy

SAVE = DeadLetterPolicy.SAVE


class PaymentGatewayBusy(Exception):
    """A 503 from the payment provider: worth retrying later."""


class SupplierTimeout(Exception):
    """The supplier's API did not answer: worth retrying later."""


@app.task(base=JobbersTask, bind=True, name="shop.send_order_confirmation")
def send_order_confirmation(self: JobbersTask, order_id: int) -> str:
    """Succeeds: submitted -> started -> completed."""
    time.sleep(0.3)
    return f"confirmation for order {order_id} sent"


@app.task(base=JobbersTask, bind=True, name="shop.charge_payment", max_retries=4,
          retry_delay=0.25, backoff_strategy=BackoffStrategy.EXPONENTIAL, max_retry_delay=5,
          expected_exceptions=(PaymentGatewayBusy,), dead_letter_policy=SAVE)
def charge_payment(self: JobbersTask, order_id: int, busy_times: int = 2) -> str:
    """Busy twice, then charged. Each retry waits in Redis (``scheduled``) for
    0.25·2^n seconds (0.5 s, then 1 s) and is re-published by a worker's scheduler."""
    if self.request.retries < busy_times:
        raise PaymentGatewayBusy(f"503 from the payment gateway for order {order_id}")
    return f"order {order_id} charged on attempt {self.attempt}"


@app.task(base=JobbersTask, bind=True, name="shop.sync_inventory", max_retries=2,
          retry_delay=0.3, backoff_strategy=BackoffStrategy.CONSTANT,
          expected_exceptions=(SupplierTimeout,), dead_letter_policy=SAVE)
def sync_inventory(self: JobbersTask, warehouse: str) -> None:
    """Times out every time: after 2 retries it fails into the dead-letter queue."""
    time.sleep(0.1)
    raise SupplierTimeout(f"warehouse {warehouse} did not answer within 30 s")


@app.task(base=JobbersTask, bind=True, name="shop.import_supplier_feed",
          dead_letter_policy=SAVE)
def import_supplier_feed(self: JobbersTask, supplier: str, rows: list[dict[str, Any]]
                         ) -> int:
    """A bug (the feed renamed a column): an unexpected exception fails at once, without
    retrying, into the dead-letter queue. Two feeds fail alike: one failure group."""
    total = 0.0
    for row in rows:
        total += float(row["price_eur"]) * int(row["qty"])
    return int(total)


@app.task(base=JobbersTask, bind=True, name="shop.render_invoice_pdf",
          max_heartbeat_interval=2, dead_letter_policy=SAVE)
def render_invoice_pdf(self: JobbersTask, invoice: str, pages: int = 3,
                       freeze_for: float = 15.0) -> str:
    """Renders a few pages, then freezes (waits on a lock nobody releases) and stops
    heartbeating: after 2 s of silence the cleaner declares it ``stalled`` (to the DLQ), and
    its prefork worker ends it (SIGTERM to its child), freeing the slot."""
    for page in range(1, pages + 1):
        time.sleep(0.2)
        self.heartbeat(progress={"page": page})
    threading.Event().wait(freeze_for)  # the "deadlock"
    # Reached only where the worker cannot end it (threads, solo pools): too late, this
    # attempt was declared stalled; heartbeat() raises AttemptSuperseded and the task's
    # late result is never recorded.
    self.heartbeat(progress={"page": pages + 1})
    return f"invoice {invoice}.pdf"


@app.task(base=JobbersTask, bind=True, name="shop.export_orders", dead_letter_policy=SAVE)
def export_orders(self: JobbersTask, month: str, batches: int = 100) -> int:
    """A long export, cancelled while it runs: ``heartbeat()`` raises ``TaskCancelled``
    once ``cancel()`` was asked, and the task ends ``cancelled``."""
    for batch in range(1, batches + 1):
        time.sleep(0.2)
        self.heartbeat(progress={"batch": batch, "of": batches})
    return batches


@app.task(base=JobbersTask, bind=True, name="shop.recalculate_prices", version=1,
          dead_letter_policy=SAVE)
def recalculate_prices(self: JobbersTask, catalog: str) -> str:
    """Version 1 here; a message published for version 2 (a newer deploy) is dropped by
    this worker before it runs, and saved to the dead-letter queue."""
    return f"prices of {catalog} recalculated"


def _chunks(task: JobbersTask, chunks: int, chunk_seconds: float) -> dict[str, Any]:
    """Work in chunks, saving a checkpoint after each; resume after the last one saved."""
    start = int(task.checkpoint or 0)
    for chunk in range(start + 1, chunks + 1):
        time.sleep(chunk_seconds)
        task.heartbeat(progress={"chunk": chunk, "of": chunks, "resumed_from": start},
                       checkpoint=chunk)
    return {"chunks": chunks, "resumed_from": start, "attempt": task.attempt,
            "worker": task.request.hostname}


@app.task(base=JobbersTask, bind=True, name="shop.reindex_catalog", queue="long",
          on_shutdown=ShutdownPolicy.RESUBMIT, max_heartbeat_interval=10,
          dead_letter_policy=SAVE)
def reindex_catalog(self: JobbersTask, chunks: int = 8, chunk_seconds: float = 0.5
                    ) -> dict[str, Any]:
    """Long; ``on_shutdown=resubmit``: when its worker gets SIGTERM (a deploy), it is
    published again with its checkpoint, and the next worker resumes after it."""
    return _chunks(self, chunks, chunk_seconds)


@app.task(base=JobbersTask, bind=True, name="shop.import_products", queue="imports",
          max_heartbeat_interval=10, max_stall_recoveries=1, dead_letter_policy=SAVE)
def import_products(self: JobbersTask, chunks: int = 8, chunk_seconds: float = 0.5
                    ) -> dict[str, Any]:
    """Long; its worker is SIGKILLed mid-way (out of memory, a lost node). The cleaner sees
    the worker gone, declares the task stalled and, with ``max_stall_recoveries=1``,
    resubmits it: another worker resumes it from its last checkpoint."""
    return _chunks(self, chunks, chunk_seconds)


@app.task(base=JobbersTask, bind=True, name="shop.rebuild_sitemap", max_concurrent=1)
def rebuild_sitemap(self: JobbersTask, part: int) -> str:
    """At most one runs at a time across all workers; the others are deferred
    (``scheduled`` for a moment) without using a retry."""
    time.sleep(0.8)
    return f"sitemap-{part}.xml"
