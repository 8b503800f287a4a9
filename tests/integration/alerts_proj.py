"""The Celery app of the alert tests (``celery -A tests.integration.alerts_proj``): failing
tasks with the dead-letter policy ``save`` and two dead-letter-rate rules, one a dead letter
each: ``ALERTS_WEBHOOK`` (the receiver under test) and, if set, ``ALERTS_WEBHOOK_AFTER``
(a second rule, handled after the first: its alert says the first was handled); and
``ALERTS_OPS_WEBHOOK``: rules on stalls and on the cleaner overdue (no beat runs here: the
worker's first catch-up pass tells it)."""

from __future__ import annotations

import os

from celery import Celery

from jobbers_celery import JobbersTask, install

REDIS_URL = os.environ["JOBBERS_TEST_REDIS_URL"]
ADMIN_URL = "https://ops.example.com/admin/"


def _rule(name: str, url: str) -> dict[str, object]:
    return {"name": name, "kind": "dead_letter_rate", "task": "alerts.*", "threshold": 1,
            "window": 600, "min_interval": 600, "webhooks": [url]}


app = Celery("alerts_proj", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    jobbers_redis_url=REDIS_URL,
    task_serializer="json", accept_content=["json"], result_serializer="json",
    broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
    jobbers_admin_url=ADMIN_URL,
    jobbers_alert_timeout=float(os.environ.get("ALERTS_TIMEOUT", "5")),
    # the receivers under test listen on 127.0.0.1: internal addresses are refused otherwise
    jobbers_alert_webhook_allow_networks=["127.0.0.0/8"],
    jobbers_alerts=[_rule("first", os.environ.get("ALERTS_WEBHOOK", "http://127.0.0.1:9/")),
                    *([_rule("after", os.environ["ALERTS_WEBHOOK_AFTER"])]
                      if os.environ.get("ALERTS_WEBHOOK_AFTER") else []),
                    *([{"name": kind, "kind": kind, "webhooks": [os.environ[
                        "ALERTS_OPS_WEBHOOK"]]} for kind in ("stall", "cleaner_overdue")]
                      if os.environ.get("ALERTS_OPS_WEBHOOK") else [])],
    # stalls and catch-up passes within seconds
    jobbers_worker_lost_after=3, jobbers_cleaner_interval=1,
)
jobbers = install(app)


def _boom(number: str) -> None:
    raise ValueError(f"order {number} failed: postgres://app:hunter2@db/orders <!channel>")


@app.task(base=JobbersTask, name="alerts.boom1", dead_letter_policy="save")
def boom1(number: str) -> None:
    _boom(number)


@app.task(base=JobbersTask, name="alerts.boom2", dead_letter_policy="save")
def boom2(number: str) -> None:
    _boom(number)


@app.task(base=JobbersTask, name="alerts.boom3", dead_letter_policy="save")
def boom3(number: str) -> None:
    _boom(number)


@app.task(base=JobbersTask, name="alerts.ok")
def ok() -> str:
    return "done"
