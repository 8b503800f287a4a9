"""The Celery app of the argument-search tests (``celery -A tests.integration.search_proj``):
indexed paths for one task name and for every task, a secret positional parameter."""

from __future__ import annotations

import os

from jobbers_celery import JobbersTask, install
from tests.testapp import make_app

REDIS_URL = os.environ["JOBBERS_TEST_REDIS_URL"]

app = make_app(
    "search_proj", REDIS_URL,
    jobbers_indexed_arguments={
        "search.import_order": ["order_id", "0"],
        "search.login": ["0", "1"],  # 1 is the password parameter: never indexed
        "*": ["customer.id"],
    },
    jobbers_search_scan_limit=int(os.environ.get("SEARCH_SCAN_LIMIT", "5000")),
)
jobbers = install(app)


@app.task(base=JobbersTask, bind=True, name="search.import_order")
def import_order(self: JobbersTask, ref: str, order_id: int | str | None = None,
                 customer: dict[str, object] | None = None,
                 card_number: str = "") -> object:
    return order_id


@app.task(base=JobbersTask, bind=True, name="search.login")
def login(self: JobbersTask, user: str, password: str) -> str:
    return user


@app.task(base=JobbersTask, bind=True, name="search.ship")
def ship(self: JobbersTask, sku: str, customer: dict[str, object] | None = None) -> str:
    return sku
